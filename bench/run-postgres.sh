#!/usr/bin/env bash
# Throughput and latency of pingback callbacks through the plugin with the
# PostgreSQL store, against a bare reverse_proxy to the same app, in the same
# run: one Caddy on the database, and two Caddy instances on one database.
#
#   bash bench/run-postgres.sh                  # 5 alternating rounds of 10 s per path
#   ROUNDS=3 DURATION=5s bash bench/run-postgres.sh
#   POOLER=pgbouncer bash bench/run-postgres.sh # Caddy's DSN through PgBouncer, transaction pooling
#   EXEC_MODE=cache_statement bash bench/run-postgres.sh  # pgx's statement cache
#
# What it does: starts a throw-away PostgreSQL cluster with .ci/postgres
# (unless PINGBACK_BENCH_PG_DSN names a database), builds ./cmd/caddy, and
# starts two Caddy processes (A: admin localhost:2990, HTTP 9090; B: admin
# localhost:2991, HTTP 9091; the app on 9092, a site of A), both with
#   /bare -> reverse_proxy to the app
#   /cb   -> pingback { provider 2captcha } + reverse_proxy to the app
# and the store `store postgres` on the same database (a fresh schema per
# run); and a third, C (admin localhost:2992, HTTP 9093), the same config on
# the Badger store (storage_dir in a temp dir under /var/tmp), for the
# Badger figure of the same run. Every request is a form POST with a NEW task id (bench/post.lua), so
# every plugin request is a committed insert plus an outcome update. Rounds
# rotate the paths after a warm-up:
#   bare  wrk on A's /bare, CONNS connections
#   pg    wrk on A's /cb, CONNS connections
#   pg2   two wrk processes at once, CONNS/2 connections each, on A's and
#         B's /cb (throughputs summed, latencies the worse of the two)
#   badger wrk on C's /cb, CONNS connections
# It prints each round, the medians and the ratios to bare. wrk, Caddy and
# PostgreSQL share the machine's cores.
#
# Environment: ROUNDS (5), DURATION (10s), WARMUP (3s), CONNS (32),
# THREADS (2), PINGBACK_BENCH_PG_DSN (empty: a throw-away cluster), KEEP (1:
# keep the temp dir with the logs), NO_COUNT_TRIGGERS (1: disable the
# records table's count triggers once the schema is made, to measure what
# they cost; the counts in /pingback/status are then wrong for the run),
# EXEC_MODE (empty: the store's default, pgx's exec mode, every statement
# sent as text and parsed each time; else pgx's default_query_exec_mode
# for Caddy's DSN: cache_statement (each statement prepared once per
# connection), cache_describe, describe_exec, exec or simple_protocol;
# psql gets the DSN without it), POOLER (empty: Caddy connects to the
# database directly; pgbouncer: Caddy's DSN goes through a PgBouncer
# (Debian's /usr/sbin/pgbouncer) in transaction pooling on 127.0.0.1, a
# free port from 6440 up, with PgBouncer's stock settings: its config sets
# only listen_addr, listen_port, auth_type (scram-sha-256), auth_file (the
# DSN's user and password) and pool_mode, and one [databases] entry for the
# DSN's database; run as the OS user postgres when the script runs as root,
# since PgBouncer refuses root; the DSN must be a postgres:// URL; psql
# and the count probes keep the direct DSN. A statement-caching EXEC_MODE
# behind it fails: the store refuses prepared statements behind a
# transaction pooler), CHURN (1: instead of the throughput rounds, the row
# versions per 1,000 pingbacks that records and the count tables keep, with
# and without a long transaction open, on Caddy A alone; direct only, not
# with POOLER; bench/pg-churn-phases.sh says how, and its settings).
set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
KEEP=${KEEP:-}
NO_COUNT_TRIGGERS=${NO_COUNT_TRIGGERS:-}
EXEC_MODE=${EXEC_MODE:-}
POOLER=${POOLER:-}
CHURN=${CHURN:-}

ADMIN_A=localhost:2990
ADMIN_B=localhost:2991
ADMIN_C=localhost:2992
PORT_A=9090
PORT_B=9091
APP_PORT=9092
PORT_C=9093

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

need_wrk

tmp=$(mktemp -d /var/tmp/pingback-bench-pg.XXXXXX)
pids=()
pg_dir=
bouncer_dir=
cleanup() {
	if declare -F churn_cleanup >/dev/null; then churn_cleanup; fi
	stop_pids "${pids[@]}"
	if [ -n "$pg_dir" ]; then
		bash .ci/postgres stop "$pg_dir"
	fi
	if [ -n "$bouncer_dir" ]; then
		if [ -n "$KEEP" ]; then cp -r "$bouncer_dir" "$tmp/pgbouncer"; fi
		rm -rf "$bouncer_dir"
	fi
	keep_or_remove "$tmp"
}
trap cleanup EXIT

# start_pgbouncer: starts PgBouncer in transaction pooling in front of
# $dsn's database (stock settings but the five it needs) and points
# caddy_dsn at it; cleanup stops it with the other processes.
start_pgbouncer() {
	local bouncer=/usr/sbin/pgbouncer re user pw hostport host port db bport p
	if [ ! -x "$bouncer" ]; then
		echo "POOLER=pgbouncer: $bouncer is missing (Debian: apt-get install pgbouncer)" >&2
		exit 1
	fi
	# postgres://user:password@host:port/database?params
	re='^postgres(ql)?://([^:@/]+):([^@/]*)@([^/?]+)/([A-Za-z0-9_]+)(\?.*)?$'
	if ! [[ $dsn =~ $re ]]; then
		echo "POOLER=pgbouncer needs a postgres:// URL DSN with user, password, host and database" >&2
		exit 1
	fi
	user=${BASH_REMATCH[2]} pw=${BASH_REMATCH[3]} hostport=${BASH_REMATCH[4]} db=${BASH_REMATCH[5]}
	user=$(printf '%b' "${user//%/\\x}") pw=$(printf '%b' "${pw//%/\\x}")
	host=${hostport%:*} port=${hostport##*:}
	if [ "$host" = "$hostport" ]; then port=5432; fi
	bport=
	for p in $(seq 6440 6499); do
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then bport=$p; break; fi
	done
	[ -n "$bport" ] || { echo "pgbouncer: no free port in 6440-6499" >&2; exit 1; }
	bouncer_dir=$(mktemp -d /tmp/pingback-bench-pgbouncer.XXXXXX)
	printf '"%s" "%s"\n' "${user//\"/\"\"}" "${pw//\"/\"\"}" >"$bouncer_dir/users.txt"
	cat >"$bouncer_dir/pgbouncer.ini" <<-INI
		[databases]
		$db = host=$host port=$port dbname=$db

		[pgbouncer]
		listen_addr = 127.0.0.1
		listen_port = $bport
		auth_type = scram-sha-256
		auth_file = $bouncer_dir/users.txt
		pool_mode = transaction
	INI
	local run=()
	if [ "$(id -u)" = 0 ]; then
		# PgBouncer refuses to run as root.
		chown -R postgres "$bouncer_dir"
		run=(setpriv --reuid postgres --regid postgres --clear-groups --)
	fi
	(cd "$bouncer_dir" && exec "${run[@]}" "$bouncer" "$bouncer_dir/pgbouncer.ini") >"$bouncer_dir/pgbouncer.log" 2>&1 &
	pids+=($!)
	caddy_dsn=${dsn/@$hostport\//@127.0.0.1:$bport/}
	for _ in $(seq 150); do
		if psql "$caddy_dsn" -Atc 'SELECT 1' >/dev/null 2>&1; then
			pooler_info="$("$bouncer" --version | head -1), transaction pooling on 127.0.0.1:$bport (POOLER=pgbouncer, stock settings)"
			return 0
		fi
		if ! kill -0 "${pids[-1]}" 2>/dev/null; then break; fi
		sleep 0.1
	done
	echo "pgbouncer did not come up; its log:" >&2
	cat "$bouncer_dir/pgbouncer.log" >&2
	exit 1
}

case "$POOLER" in
'' | pgbouncer) ;;
*) echo "POOLER=$POOLER: want empty (direct) or pgbouncer" >&2; exit 1 ;;
esac
if [ -n "$CHURN" ] && [ -n "$POOLER" ]; then
	# The pooler keeps its server connections, whose statistics the
	# phases wait for by their end.
	echo "CHURN=1 runs on a direct connection only, not with POOLER" >&2
	exit 1
fi
dsn=${PINGBACK_BENCH_PG_DSN:-}
if [ -z "$dsn" ]; then
	eval "$(bash .ci/postgres start)"
	pg_dir=$PINGBACK_PG_DIR
	dsn=$PINGBACK_TEST_PG_DSN
fi
schema="bench_$(date +%s)"
caddy_dsn=$dsn
pooler_info="none: Caddy connects to the database directly"
if [ "$POOLER" = pgbouncer ]; then
	start_pgbouncer
fi
if [ -n "$EXEC_MODE" ]; then
	case "$dsn" in
	postgres://*\?* | postgresql://*\?*) caddy_dsn="$caddy_dsn&default_query_exec_mode=$EXEC_MODE" ;;
	postgres://* | postgresql://*) caddy_dsn="$caddy_dsn?default_query_exec_mode=$EXEC_MODE" ;;
	*) caddy_dsn="$caddy_dsn default_query_exec_mode=$EXEC_MODE" ;; # key=value form
	esac
fi

echo "== machine"
banner cores cpu
echo "postgres:   $(psql "$dsn" -Atc 'SHOW server_version') on $(psql "$dsn" -Atc 'SHOW data_directory' 2>/dev/null || echo '?'), synchronous_commit $(psql "$dsn" -Atc 'SHOW synchronous_commit'), fsync $(psql "$dsn" -Atc 'SHOW fsync')"
echo "pooler:     $pooler_info"
echo "pgx mode:   ${EXEC_MODE:-exec, the store default} (EXEC_MODE)"
banner go wrk

echo "== building ./cmd/caddy"
build_binaries "$tmp"

# instance ADMIN PORT [OPTION...]: the Caddyfile of one instance, on the
# run's schema; OPTIONs as caddyfile's in bench/lib.sh: app, or
# pingback=storage_dir DIR for the Badger store instead (the later wins).
instance() {
	caddyfile "$1" "$2" "$APP_PORT" "pingback=store postgres {
			dsn \"$caddy_dsn\"
			schema $schema
		}" bare "${@:3}"
}
instance $ADMIN_A $PORT_A app >"$tmp/Caddyfile.a"
instance $ADMIN_B $PORT_B >"$tmp/Caddyfile.b"
instance $ADMIN_C $PORT_C "pingback=storage_dir $tmp/badger" >"$tmp/Caddyfile.c"

if [ -n "$CHURN" ]; then
	# shellcheck source=bench/pg-churn-phases.sh
	. bench/pg-churn-phases.sh
	churn
	exit 0
fi

for x in a b c; do
	mkdir -p "$tmp/$x"
	launch_caddy "$tmp/caddy" "$tmp/Caddyfile.$x" "$tmp/caddy-$x.log" "$tmp/$x"
	pids+=("$caddy_pid")
done

for port in $PORT_A $PORT_B $PORT_C; do
	if ! wait_until 200 0.1 "" routes_answer "$port" "1$port"; then
		echo "caddy on port $port did not come up; logs:" >&2
		cat "$tmp"/caddy-*.log >&2
		exit 1
	fi
done

if [ -n "$NO_COUNT_TRIGGERS" ]; then
	for trg in records_count_insert records_count_update records_count_delete; do
		psql "$dsn" -qc "ALTER TABLE $schema.records DISABLE TRIGGER $trg"
	done
	echo "count triggers: disabled (NO_COUNT_TRIGGERS)"
fi
if [ -n "$EXEC_MODE" ]; then
	echo "pgx exec mode: $EXEC_MODE (EXEC_MODE)"
fi

# xid: a new transaction id (txid_current assigns one).
xid() { psql "$dsn" -Atc 'SELECT txid_current()'; }

# wrk1 URL CONNS DUR TAG PREFIX_DIGIT: one wrk run; prints
# "requests duration_us p50_us p99_us errors".
wrk1() {
	local out="$tmp/wrk-$4.txt" line
	BENCH_PREFIX="$(date +%s%3N)$5" \
		wrk -t "$THREADS" -c "$2" -d "$3" --latency -s bench/post.lua "$1" >"$out" 2>&1
	line=$(wrk_result "$out") || exit 1
	echo "$line" | awk '{
		for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		printf "%d %d %d %d %d\n", v["requests"], v["duration_us"], v["p50_us"], v["p99_us"],
			v["non2xx"] + v["connect"] + v["read"] + v["write"] + v["timeout"]
	}'
}

# load PATH DUR TAG: prints "reqs_per_s p50_us p99_us".
load() {
	local a b
	case $1 in
	bare) a=$(wrk1 "http://127.0.0.1:$PORT_A/bare" "$CONNS" "$2" "$3" 1) ;;
	pg) a=$(wrk1 "http://127.0.0.1:$PORT_A/cb" "$CONNS" "$2" "$3" 1) ;;
	badger) a=$(wrk1 "http://127.0.0.1:$PORT_C/cb" "$CONNS" "$2" "$3" 1) ;;
	pg2)
		wrk1 "http://127.0.0.1:$PORT_B/cb" $((CONNS / 2)) "$2" "$3-b" 2 >"$tmp/$3-b.res" &
		a=$(wrk1 "http://127.0.0.1:$PORT_A/cb" $((CONNS / 2)) "$2" "$3-a" 1)
		wait $!
		b=$(cat "$tmp/$3-b.res")
		;;
	esac
	printf '%s\n%s\n' "$a" "${b:-}" | awk 'NF {
		rps += $1 / ($2 / 1e6); if ($3 > p50) p50 = $3; if ($4 > p99) p99 = $4; errs += $5
	} END {
		if (errs > 0) printf "warning: %d errors\n", errs > "/dev/stderr"
		printf "%.0f %d %d\n", rps, p50, p99
	}'
}

echo "== warm-up ($WARMUP per path)"
for p in bare pg pg2 badger; do load $p "$WARMUP" "warmup-$p" >/dev/null; done

echo "== $ROUNDS rounds of $DURATION per path, $CONNS connections in all, $THREADS wrk threads per wrk"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-6s %9s %8s %8s %9s\n' round path "req/s" "p50 ms" "p99 ms" "tx/stored"
paths=(bare pg pg2 badger)
for p in "${paths[@]}"; do : >"$tmp/$p.dat"; done
for r in $(seq "$ROUNDS"); do
	# Rotate the order so that no path always runs first.
	for i in 0 1 2 3; do
		p=${paths[$(((i + r) % 4))]}
		x0=$(xid) s0=$(stored $ADMIN_A $ADMIN_B)
		res=$(load "$p" "$DURATION" "round$r-$p")
		x1=$(xid) s1=$(stored $ADMIN_A $ADMIN_B)
		# Write transactions per stored pingback: transaction ids the
		# database assigned during the round (one probe included; forwards
		# still finishing from the previous path may spill in), per
		# result the instances stored; for the PostgreSQL paths only.
		tx=-
		if [ "$p" = pg ] || [ "$p" = pg2 ]; then
			tx=$(awk -v x="$((x1 - x0))" -v s="$((s1 - s0))" 'BEGIN { if (s > 0) printf "%.2f", x / s; else print "-" }')
			[ "$tx" = - ] || echo "$tx" >>"$tmp/$p.tx"
		fi
		echo "$res" >>"$tmp/$p.dat"
		echo "$res" | awk -v r="$r" -v n="$p" -v tx="$tx" '{ printf "%-6s %-6s %9d %8.2f %8.2f %9s\n", r, n, $1, $2 / 1000, $3 / 1000, tx }'
	done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

echo "== medians of $ROUNDS rounds"
printf '%-6s %9s %8s %8s %14s\n' path "req/s" "p50 ms" "p99 ms" "throughput/bare"
bare=$(median 1 "$tmp/bare.dat")
for p in "${paths[@]}"; do
	awk -v n="$p" -v a="$(median 1 "$tmp/$p.dat")" -v b="$(median 2 "$tmp/$p.dat")" \
		-v c="$(median 3 "$tmp/$p.dat")" -v bare="$bare" \
		'BEGIN { printf "%-6s %9d %8.2f %8.2f %13.2fx\n", n, a, b / 1000, c / 1000, a / bare }'
done
for p in pg pg2; do
	echo "$p: $(median 1 "$tmp/$p.tx") write transactions per stored pingback (median of the rounds)"
done

echo "== plugin counters (admin /metrics of A, B and C)"
for admin in $ADMIN_A $ADMIN_B $ADMIN_C; do
	curl -fsS "http://$admin/metrics" | grep -E '^caddy_pingback_(callbacks|forwards)_total' || echo "(no pingback metrics)"
done
echo "== records in the database by state"
psql "$dsn" -Atc "SELECT state, count(*) FROM $schema.records GROUP BY state ORDER BY state"
psql "$dsn" -qc "DROP SCHEMA $schema CASCADE"
