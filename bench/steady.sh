#!/usr/bin/env bash
# Disk that stops growing: a steady-state run. Caddy takes RATE pingbacks a
# second for DURATION with a short `retention`, so that results expire as
# fast as they arrive, and the store's size on disk is sampled every SAMPLE:
# after the first three retention periods it should stay within 10% of its
# level, and Caddy's CPU per pingback and the live p99 should stay flat.
#
#   bash bench/steady.sh                                       # Badger, 200/s for 30m, retention 2m, samples of 30s
#   STORE=postgres bash bench/steady.sh                        # the same on PostgreSQL (a throw-away cluster)
#   DURATION=90s RETENTION=20s SAMPLE=15s bash bench/steady.sh # a smoke run
#
# What it does: builds ./cmd/caddy and bench/loadgen into a temp dir under
# BENCH_DIR and starts one Caddy (admin localhost:2976, HTTP 9076, the app
# a site of the same Caddy on 9077: `respond "ok" 200`; with STORE=postgres
# 2936, 9036 and 9037) whose global
# pingback block is the store (STORE=badger: storage_dir in the temp dir;
# STORE=postgres: `store postgres` with a fresh schema bench_steady_<time>
# on PINGBACK_BENCH_PG_DSN, or on a throw-away cluster of .ci/postgres when
# that is empty, as bench/run-postgres.sh does) and `retention RETENTION`.
# The pingback route /cb (provider 2captcha, then reverse_proxy to the app)
# is loaded by bench/loadgen (open loop, a new task id per request) at RATE
# for DURATION, run as back-to-back windows of SAMPLE, each its own loadgen
# process, so that each window has its own p50/p99/p99.9. At the end of each
# window (the next one already running) it samples:
#   - the store's size on disk (allocated blocks, not apparent sizes):
#     Badger: the storage dir in all and by kind (*.sst tables, *.vlog value
#     logs, *.mem memtable logs, the journal pingback-journal.*, other:
#     MANIFEST, DISCARD, KEYREGISTRY, ...); PostgreSQL (psql):
#     pg_total_relation_size of each of the schema's tables and
#     pg_relation_size of each index, summed as total, tables (heap, TOAST,
#     maps) and indexes, with the records table's dead tuples and
#     autovacuum count (pg_stat_user_tables);
#   - the records by state (caddy_pingback_records of /metrics);
#   - Caddy's CPU in the window (utime+stime of /proc/<pid>/stat) per
#     pingback the window sent, and its RssAnon;
#   - the window's loadgen p50/p99/p99.9, non-2xx answers and errors.
# It prints a row per sample (elapsed, size MiB in all and by kind, records,
# p99 ms, CPU µs per pingback, non-2xx+errors), writes every figure to
# steady.csv in the run's temp dir (kept; its path printed; the store
# itself is removed unless KEEP), and a verdict on the samples taken after
# the first three retention periods: the level (their mean size) and the
# largest deviation from it in % (aim: within 10%); and, first half of
# those windows against the second half, the ratio of their mean CPU per
# pingback and of their mean p99 ("flat" when the ratio is at most
# FLAT, 1.2 by default: the script's own threshold, the issue gives none).
# PostgreSQL runs with autovacuum at its defaults (the script says so and
# lists any autovacuum setting that is not), and prints each table's and
# index's size at the end. There the expiry sweep runs once a minute (the
# replay loop's housekeeping), so records and sizes carry a sawtooth of up
# to a minute of results on top of RETENTION's worth: a smoke run of a
# minute or two shows no level.
#
# Environment: STORE (badger | postgres), RATE (200, pingbacks/s), DURATION
# (30m), SAMPLE (30s), RETENTION (2m; durations as Ns, Nm or Nh), CONNS
# (64, loadgen's connections), FLAT (1.2), BENCH_DIR (/var/tmp),
# PINGBACK_BENCH_PG_DSN (empty: a throw-away cluster), KEEP (1: keep the
# store and the PostgreSQL schema too).
set -euo pipefail

STORE=${STORE:-badger}
RATE=${RATE:-200}
DURATION=${DURATION:-30m}
SAMPLE=${SAMPLE:-30s}
RETENTION=${RETENTION:-2m}
CONNS=${CONNS:-64}
FLAT=${FLAT:-1.2}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
KEEP=${KEEP:-}

# Each store its own ports, so that a Badger and a PostgreSQL run can go
# side by side.
if [ "$STORE" = postgres ]; then
	ADMIN=localhost:2936
	PORT=9036
	APP_PORT=9037
else
	ADMIN=localhost:2976
	PORT=9076
	APP_PORT=9077
fi

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

# seconds DUR: DUR (Ns, Nm, Nh or a bare number of seconds) in whole
# seconds; status 1 for anything else.
seconds() {
	case $1 in
	*[!0-9smh]* | '') return 1 ;;
	*h) echo $((${1%h} * 3600)) ;;
	*m) echo $((${1%m} * 60)) ;;
	*s) echo $((${1%s})) ;;
	*) echo $(($1)) ;;
	esac
}

for v in DURATION SAMPLE RETENTION; do
	if ! s=$(seconds "${!v}") || [ "$s" -le 0 ]; then
		echo "$v=${!v}: want a positive duration in whole seconds, minutes or hours (30s, 2m, 1h)" >&2
		exit 1
	fi
	printf -v "${v}_S" %d "$s"
done
case $STORE in
badger | postgres) ;;
*) echo "STORE=$STORE: want badger or postgres" >&2; exit 1 ;;
esac
WINDOWS=$((DURATION_S / SAMPLE_S))
WARM_S=$((3 * RETENTION_S))
if [ "$WINDOWS" -lt 2 ]; then
	echo "DURATION=$DURATION holds fewer than two windows of SAMPLE=$SAMPLE" >&2
	exit 1
fi
if [ "$WARM_S" -ge "$DURATION_S" ]; then
	echo "warning: DURATION=$DURATION ends within the first three retention periods ($WARM_S s): no verdict" >&2
fi

mkdir -p "$BENCH_DIR"
tmp=$(mktemp -d "$BENCH_DIR/pingback-steady.XXXXXX")
csv=$tmp/steady.csv
pids=()
pg_dir=
dsn=
schema=
cleanup() {
	stop_pids "${pids[@]}"
	if [ -n "$schema" ] && [ -z "$KEEP" ]; then
		psql "$dsn" -qc "DROP SCHEMA IF EXISTS $schema CASCADE" 2>/dev/null || true
	fi
	if [ -n "$pg_dir" ]; then
		bash .ci/postgres stop "$pg_dir"
	fi
	if [ -z "$KEEP" ]; then
		rm -rf "$tmp/badger" "$tmp/state" "$tmp/caddy" "$tmp/loadgen"
	fi
	echo "run directory (CSV, logs, loadgen output): $tmp"
}
trap cleanup EXIT

store_block="storage_dir $tmp/badger"
if [ "$STORE" = postgres ]; then
	dsn=${PINGBACK_BENCH_PG_DSN:-}
	if [ -z "$dsn" ]; then
		eval "$(bash .ci/postgres start)"
		pg_dir=$PINGBACK_PG_DIR
		dsn=$PINGBACK_TEST_PG_DSN
	fi
	schema="bench_steady_$(date +%s)"
	store_block="store postgres {
			dsn \"$dsn\"
			schema $schema
		}"
fi

echo "== machine"
banner cores cpu memory kernel
if [ "$STORE" = badger ]; then
	storage_line "$tmp/badger" "$tmp"
else
	echo "postgres:   $(psql "$dsn" -Atc 'SHOW server_version'), synchronous_commit $(psql "$dsn" -Atc 'SHOW synchronous_commit'), fsync $(psql "$dsn" -Atc 'SHOW fsync')"
	echo "autovacuum: $(psql "$dsn" -Atc 'SHOW autovacuum'), at its defaults: naptime $(psql "$dsn" -Atc 'SHOW autovacuum_naptime'), vacuum scale factor $(psql "$dsn" -Atc 'SHOW autovacuum_vacuum_scale_factor'), threshold $(psql "$dsn" -Atc 'SHOW autovacuum_vacuum_threshold'), insert scale factor $(psql "$dsn" -Atc 'SHOW autovacuum_vacuum_insert_scale_factor'), cost limit $(psql "$dsn" -Atc 'SHOW autovacuum_vacuum_cost_limit')"
	nondefault=$(psql "$dsn" -Atc "SELECT string_agg(name || '=' || setting || ' (' || source || ')', ', ') FROM pg_settings WHERE name LIKE 'autovacuum%' AND source NOT IN ('default', 'override')")
	if [ -n "$nondefault" ]; then
		echo "warning: autovacuum settings not at their defaults: $nondefault"
	fi
fi
banner go commit
echo "run:        STORE=$STORE RATE=$RATE/s DURATION=$DURATION SAMPLE=$SAMPLE RETENTION=$RETENTION ($WINDOWS windows; verdict on samples from ${WARM_S}s)"

echo "== building ./cmd/caddy and bench/loadgen"
build_binaries "$tmp" bench/loadgen

caddyfile "$ADMIN" "$PORT" "$APP_PORT" "pingback=$store_block
		retention $RETENTION" bare app >"$tmp/Caddyfile"
mkdir -p "$tmp/state"
launch_caddy "$tmp/caddy" "$tmp/Caddyfile" "$tmp/caddy.log" "$tmp/state"
pids+=("$caddy_pid")
if ! wait_until 300 0.1 "$caddy_pid" routes_answer "$PORT" "$(date +%s)0"; then
	echo "caddy did not come up; its log:" >&2
	cat "$tmp/caddy.log" >&2
	exit 1
fi

hz=$(getconf CLK_TCK)
# cpu_ticks: Caddy's utime+stime in clock ticks (/proc/<pid>/stat fields
# 14 and 15, counted after the parenthesised command name).
cpu_ticks() {
	local stat f
	read -r stat <"/proc/$caddy_pid/stat"
	read -ra f <<<"${stat##*) }"
	echo $((f[11] + f[12]))
}

# rss_anon: Caddy's RssAnon in KiB.
rss_anon() { awk '/^RssAnon:/ { print $2 }' "/proc/$caddy_pid/status"; }

states=(queued forwarding delivered failed rejected parked quarantined expired)
# records: the records by state (summed over providers), in the order of
# states, then their total, from /metrics.
records() {
	curl -fsS "http://$ADMIN/metrics" | awk -v list="${states[*]}" '
		/^caddy_pingback_records\{/ {
			match($0, /state="[^"]*"/); s = substr($0, RSTART + 7, RLENGTH - 8); n[s] += $NF
		}
		END {
			k = split(list, st, " ")
			for (i = 1; i <= k; i++) { printf "%d ", n[st[i]]; t += n[st[i]] }
			printf "%d\n", t
		}'
}

# badger_sizes: bytes allocated in the storage dir: total sst vlog mem
# journal other.
badger_sizes() {
	find "$tmp/badger" -type f -printf '%b %f\n' | awk '
		{ b = $1 * 512; t += b }
		$2 ~ /\.sst$/ { sst += b; next }
		$2 ~ /\.vlog$/ { vlog += b; next }
		$2 ~ /\.mem$/ { mem += b; next }
		$2 ~ /^pingback-journal\./ { j += b; next }
		{ o += b }
		END { printf "%.0f %.0f %.0f %.0f %.0f %.0f\n", t, sst, vlog, mem, j, o }'
}

# pg_rels: the schema's tables and indexes, one "name kind" a line (kind r
# or i), tables first, each by name.
pg_rels() {
	psql "$dsn" -AtF' ' -c "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = '$schema' AND c.relkind IN ('r', 'i') ORDER BY c.relkind DESC, c.relname"
}

# pg_sizes: total tables indexes records_dead_tup records_autovacuums,
# then one size per relation of rels (pg_total_relation_size of a table,
# pg_relation_size of an index), in bytes, on one line.
pg_sizes() {
	psql "$dsn" -AtF' ' -c "WITH r AS (
		SELECT c.relname, c.relkind, c.oid, CASE c.relkind WHEN 'r' THEN pg_total_relation_size(c.oid) ELSE pg_relation_size(c.oid) END AS size
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = '$schema' AND c.relkind IN ('r', 'i'))
	SELECT (SELECT sum(size) FROM r WHERE relkind = 'r'),
		(SELECT sum(pg_table_size(oid)) FROM r WHERE relkind = 'r'),
		(SELECT sum(size) FROM r WHERE relkind = 'i'),
		coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = '$schema' AND relname = 'records'), 0),
		coalesce((SELECT autovacuum_count FROM pg_stat_user_tables WHERE schemaname = '$schema' AND relname = 'records'), 0),
		(SELECT string_agg(coalesce(r.size, 0)::text, ' ' ORDER BY x.ord) FROM unnest(string_to_array('${rel_names[*]}', ' ')) WITH ORDINALITY AS x(name, ord) LEFT JOIN r ON r.relname = x.name)"
}

rel_names=()
if [ "$STORE" = postgres ]; then
	while read -r name _; do rel_names+=("$name"); done < <(pg_rels)
	size_cols="size_total,size_tables,size_indexes,records_dead_tup,records_autovacuums"
	for name in "${rel_names[@]}"; do size_cols+=",rel_$name"; done
	size_head=$(printf '%9s %9s %9s' "tables" "indexes" "dead tup")
else
	size_cols="size_total,size_sst,size_vlog,size_mem,size_journal,size_other"
	size_head=$(printf '%7s %7s %7s %7s %7s' sst vlog mem journal other)
fi
state_cols=$(IFS=,; echo "${states[*]}")
echo "window,elapsed_s,$size_cols,$state_cols,records,requests,p50_us,p99_us,p999_us,non2xx,errors,late_ms,cpu_us,cpu_us_per_pingback,rss_anon_kib" >"$csv"

# window I: starts loadgen's window I in the background; sets lg_pid.
window() {
	"$tmp/loadgen" -url "http://127.0.0.1:$PORT/cb" -rate "$RATE" -duration "${SAMPLE_S}s" \
		-conns "$CONNS" -prefix "$(date +%s%3N)$1" >"$tmp/window-$1.txt" 2>&1 &
	lg_pid=$!
}

# field KEY LINE: the value of KEY=value in a RESULT line.
field() { awk -v k="$1" '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) print kv[2] } }' <<<"$2"; }

echo "== $WINDOWS windows of $SAMPLE at $RATE pingbacks/s on /cb (sizes in MiB, allocated on disk)"
printf '%8s %8s %s %9s %8s %10s %6s\n' "elapsed" "total" "$size_head" records "p99 ms" "CPU us/pb" errs
start=$EPOCHREALTIME
cpu0=$(cpu_ticks)
window 1
for i in $(seq "$WINDOWS"); do
	wait "$lg_pid" || true
	cpu1=$(cpu_ticks)
	now=$EPOCHREALTIME
	if [ "$i" -lt "$WINDOWS" ]; then window $((i + 1)); fi
	if ! alive "$caddy_pid"; then
		echo "caddy exited; its log:" >&2
		cat "$tmp/caddy.log" >&2
		exit 1
	fi
	res=$(wrk_result "$tmp/window-$i.txt") || exit 1
	if [ "$STORE" = badger ]; then sizes=$(badger_sizes); else sizes=$(pg_sizes); fi
	recs=$(records)
	rss=$(rss_anon)
	reqs=$(field requests "$res")
	elapsed=$(awk -v a="$start" -v b="$now" 'BEGIN { printf "%.1f", b - a }')
	cpu_us=$(((cpu1 - cpu0) * 1000000 / hz))
	cpu0=$cpu1
	per=$(awk -v c="$cpu_us" -v n="$reqs" 'BEGIN { printf "%.1f", (n > 0 ? c / n : 0) }')
	row="$i,$elapsed,${sizes// /,},${recs// /,},$reqs,$(field p50_us "$res"),$(field p99_us "$res"),$(field p999_us "$res"),$(field non2xx "$res"),$(field errors "$res"),$(field late_ms "$res"),$cpu_us,$per,$rss"
	echo "$row" >>"$csv"
	set -- $sizes
	awk -v e="$elapsed" -v store="$STORE" -v a="$1" -v b="$2" -v c="$3" -v d="$4" -v f="${5:-0}" -v g="${6:-0}" \
		-v recs="${recs##* }" -v p99="$(field p99_us "$res")" -v per="$per" \
		-v errs="$(($(field non2xx "$res") + $(field errors "$res")))" 'BEGIN {
		m = 1048576
		line = sprintf("%8s %8.1f ", e, a / m)
		if (store == "badger") line = line sprintf("%7.1f %7.1f %7.1f %7.1f %7.1f", b / m, c / m, d / m, f / m, g / m)
		else line = line sprintf("%9.1f %9.1f %9d", b / m, c / m, d)
		printf "%s %9d %8.2f %10.1f %6d\n", line, recs, p99 / 1000, per, errs
	}'
done

echo "== verdict (samples after the first three retention periods: from ${WARM_S}s)"
awk -F, -v warm="$WARM_S" -v flat="$FLAT" '
	NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
	$2 >= warm { n++; size[n] = $(col["size_total"]); cpu[n] = $(col["cpu_us_per_pingback"]); p99[n] = $(col["p99_us"]) }
	END {
		if (n < 2) { print "fewer than two samples after the warm-up: no verdict (a longer DURATION or a shorter RETENTION)"; exit }
		for (i = 1; i <= n; i++) level += size[i]
		level /= n
		for (i = 1; i <= n; i++) { d = (size[i] - level) / level * 100; if (d < 0) d = -d; if (d > dev) dev = d }
		printf "disk: level %.1f MiB over %d samples, largest deviation %.1f%% (aim: within 10%%): %s\n",
			level / 1048576, n, dev, dev <= 10 ? "met" : "missed"
		h = int(n / 2)
		for (i = 1; i <= h; i++) { c1 += cpu[i]; q1 += p99[i] }
		for (i = h + 1; i <= n; i++) { c2 += cpu[i]; q2 += p99[i] }
		c1 /= h; q1 /= h; c2 /= n - h; q2 /= n - h
		rc = c1 > 0 ? c2 / c1 : 0; rq = q1 > 0 ? q2 / q1 : 0
		printf "cpu:  %.1f then %.1f us per pingback (windows 1-%d against %d-%d after the warm-up): ratio %.2f, %s\n",
			c1, c2, h, h + 1, n, rc, rc <= flat ? "flat" : "grows"
		printf "p99:  %.2f then %.2f ms: ratio %.2f, %s (flat: ratio at most %s)\n",
			q1 / 1000, q2 / 1000, rq, rq <= flat ? "flat" : "grows", flat
	}' "$csv"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next } { n += $(col["non2xx"]); e += $(col["errors"]) } END { printf "non-2xx answers %d, errors %d over the run\n", n, e }' "$csv"

if [ "$STORE" = postgres ]; then
	echo "== tables and indexes at the end (autovacuum at its defaults)"
	psql "$dsn" -c "SELECT c.relname AS relation, CASE c.relkind WHEN 'r' THEN 'table' ELSE 'index' END AS kind,
		pg_size_pretty(CASE c.relkind WHEN 'r' THEN pg_total_relation_size(c.oid) ELSE pg_relation_size(c.oid) END) AS size,
		s.n_live_tup AS live, s.n_dead_tup AS dead, s.autovacuum_count AS autovacuums, s.last_autovacuum
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
		WHERE n.nspname = '$schema' AND c.relkind IN ('r', 'i') ORDER BY c.relkind DESC, c.relname"
fi
echo "csv: $csv"
