#!/usr/bin/env bash
# The Badger store's journal against Badger's own SyncWrites (the design
# before the journal), at the rates users have: latency of the pingback
# route and Caddy's CPU per pingback, with the journal (the default) and
# without it.
#
#   bash bench/journal.sh                                     # 20, 200 and 1000/s, 3 rounds of 30 s per rate and mode
#   RATES="200" ROUNDS=5 bash bench/journal.sh                # one rate, more rounds
#   RATES="20 200" DURATION=5s ROUNDS=1 bash bench/journal.sh # a smoke run
#
# What it does: builds bench/syncwrites (Caddy with the plugin and one store
# module more, pingback.stores.badger_syncwrites: the Badger store opened
# with badgerstore.Options.JournalSize -1) and bench/loadgen into a temp dir
# under BENCH_DIR. Both modes run that same binary on a JSON config adapted
# from one Caddyfile (bench/lib.sh's, the app as a site of the same Caddy on
# APP_PORT answering "ok"); they differ only in the store module: badger
# (journal) or badger_syncwrites (syncwrites). For each rate of RATES,
# ROUNDS pairs of rounds alternating in ABBA order (journal first in odd
# rounds). Each round:
#   - a fresh, empty store in the temp dir; Caddy started on it, awaited
#     until its admin API answers /pingback/status (whose store kind must
#     be the mode's module), then one pingback answered 200;
#   - WARMUP of bench/loadgen at the rate on the pingback route, then
#     DURATION of it (open loop: latency timed from each request's intended
#     send time; see its doc);
#   - Caddy's CPU time (utime + stime of /proc/<pid>/stat, all its threads;
#     the app's answers included, the same in both modes) from just before
#     the measured run to just after it, divided by the pingbacks sent in
#     it; the resolution is a clock tick (10 ms on most kernels), so the
#     figure at 20/s is coarse;
#   - Caddy's /metrics: every pingback answered 200 (the probe, warm-up and
#     measured run) must be stored (caddy_pingback_callbacks_total
#     {result="stored"}); then Caddy is stopped.
# It prints each round (rate, mode, p50, p99, p99.9 in ms, Caddy's CPU in µs
# per pingback, the 200s, the stored count, loadgen's errors and non-2xx
# answers, how late loadgen's last request was sent), then the medians per
# rate and mode with the syncwrites/journal ratio of each figure, and
# whether every 200 was durable.
#
# Environment: RATES ("20 200 1000", pingbacks a second), ROUNDS (3 pairs),
# DURATION (30s), WARMUP (5s), CONNS (64, loadgen's most requests in
# flight), BENCH_DIR (/var/tmp: the store's filesystem is part of what is
# measured, and the banner names it), KEEP (1: keep the temp dir with logs).
# Ports: admin localhost:2966, HTTP 9066, the app 9067.
set -euo pipefail

RATES=${RATES:-20 200 1000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-30s}
WARMUP=${WARMUP:-5s}
CONNS=${CONNS:-64}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
KEEP=${KEEP:-}

ADMIN=localhost:2966
PORT=9066
APP_PORT=9067

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

tmp=$(mktemp -d "$BENCH_DIR/pingback-journal.XXXXXX")
caddy_pid=
cleanup() {
	stop_pids "$caddy_pid"
	keep_or_remove "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== machine"
banner cores cpu memory kernel
storage_line "$tmp" "$tmp" mount
banner go commit

echo "== building bench/syncwrites and bench/loadgen"
go build -o "$tmp/caddy" ./bench/syncwrites
go build -o "$tmp/loadgen" ./bench/loadgen

# The configs of the two modes: one Caddyfile adapted to JSON, the store
# module renamed for syncwrites (the Caddyfile has no name for it).
caddyfile "$ADMIN" "$PORT" "$APP_PORT" app "pingback=store badger {
		dir $tmp/store
	}" >"$tmp/Caddyfile"
"$tmp/caddy" adapt --config "$tmp/Caddyfile" --adapter caddyfile 2>/dev/null >"$tmp/journal.json"
sed 's/"module":"badger"/"module":"badger_syncwrites"/' "$tmp/journal.json" >"$tmp/syncwrites.json"
if ! grep -q '"module":"badger_syncwrites"' "$tmp/syncwrites.json"; then
	echo "the adapted config names no badger store module:" >&2
	cat "$tmp/journal.json" >&2
	exit 1
fi

# launch_json CONFIG LOG: Caddy started in the background on the JSON config
# CONFIG, its output appended to LOG (launch_caddy adapts a Caddyfile);
# sets caddy_pid.
launch_json() {
	XDG_DATA_HOME=$tmp/xdg-data XDG_CONFIG_HOME=$tmp/xdg-config \
		"$tmp/caddy" run --config "$1" >>"$2" 2>&1 &
	caddy_pid=$!
}

# cpu_ticks: Caddy's utime + stime in clock ticks (fields 14 and 15 of
# /proc/<pid>/stat, counted after the parenthesised name); status 1 when
# Caddy is gone.
cpu_ticks() {
	local stat
	if ! read -r stat 2>/dev/null <"/proc/$caddy_pid/stat"; then
		echo "caddy (pid $caddy_pid) is gone; the logs: $tmp/caddy-*.log (KEEP=1 keeps them)" >&2
		return 1
	fi
	awk '{ print $12 + $13 }' <<<"${stat##*) }"
}
tick_us=$((1000000 / $(getconf CLK_TCK)))

# load TAG RATE DURATION PREFIX: loadgen on the pingback route; prints
# "requests p50_us p99_us p999_us non2xx errors late_ms".
load() {
	local out="$tmp/load-$1.txt" line
	"$tmp/loadgen" -url "http://127.0.0.1:$PORT/cb" -rate "$2" -duration "$3" -conns "$CONNS" -prefix "$4" >"$out" 2>&1 || true
	line=$(wrk_result "$out") || exit 1
	awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		print v["requests"], v["p50_us"], v["p99_us"], v["p999_us"], v["non2xx"], v["errors"], v["late_ms"] }' <<<"$line"
}

# round RATE R MODE: one round; appends a line to $tmp/rounds.dat:
# rate mode r p50_us p99_us p999_us cpu_us_per_pingback ok200 stored errs late_ms
round() {
	local rate=$1 r=$2 mode=$3 log="$tmp/caddy-$1-$2-$3.log"
	rm -rf "$tmp/store"
	launch_json "$tmp/$mode.json" "$log"
	if ! wait_until 600 0.05 "$caddy_pid" admin_answers "$ADMIN"; then
		echo "caddy did not come up (rate $rate, round $r, $mode); its log:" >&2
		tail -50 "$log" >&2
		exit 1
	fi
	local ok=0 w c0 c1 reqs p50 p99 p999 non2xx errs late stored status kind=badger
	if [ "$mode" = syncwrites ]; then kind=badger_syncwrites; fi
	# The store the round measures is the one its mode names.
	status=$(curl -fsS "http://$ADMIN/pingback/status" | tr -d ' \n\t')
	if [[ $status != *"\"kind\":\"$kind\""* ]]; then
		echo "/pingback/status names no store of kind $kind (rate $rate, round $r, $mode)" >&2
		exit 1
	fi
	if ! curl -fsS -o /dev/null -d "id=30&code=ready" "http://127.0.0.1:$PORT/cb"; then
		echo "the pingback route did not answer 200 (rate $rate, round $r, $mode); Caddy's log:" >&2
		tail -50 "$log" >&2
		exit 1
	fi
	ok=1
	w=$(load "$rate-$r-$mode-warmup" "$rate" "$WARMUP" 1)
	ok=$((ok + $(awk '{ print $1 - $5 - $6 }' <<<"$w")))
	c0=$(cpu_ticks)
	w=$(load "$rate-$r-$mode" "$rate" "$DURATION" 2)
	c1=$(cpu_ticks)
	read -r reqs p50 p99 p999 non2xx errs late <<<"$w"
	ok=$((ok + reqs - non2xx - errs))
	stored=$(stored "$ADMIN") || stored=-1
	stop_pids "$caddy_pid"
	caddy_pid=
	echo "$rate $mode $r $p50 $p99 $p999 $(awk -v d="$((c1 - c0))" -v t="$tick_us" -v n="$reqs" 'BEGIN { printf "%.1f", (n ? d * t / n : 0) }') $ok $stored $((non2xx + errs)) $late" >>"$tmp/rounds.dat"
	tail -1 "$tmp/rounds.dat" | awk '{ printf "%5d %-10s %2d %8.2f %8.2f %8.2f %8.1f %7d %7s %5d %7d\n",
		$1, $2, $3, $4 / 1000, $5 / 1000, $6 / 1000, $7, $8, ($9 < 0 ? "?" : $9), $10, $11 }'
}

echo "== rates $RATES; per rate $ROUNDS pairs of rounds (journal / syncwrites, ABBA), each: a fresh store, Caddy started, $WARMUP warm-up, $DURATION of bench/loadgen at the rate ($CONNS connections at most) on the pingback route"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "latency in ms, from each request's intended send time; cpu: Caddy's µs per pingback; errs: loadgen's errors and non-2xx; late: how late loadgen's last request was sent (ms)"
printf '%5s %-10s %2s %8s %8s %8s %8s %7s %7s %5s %7s\n' rate mode r p50 p99 p99.9 "cpu µs" 200s stored errs late
: >"$tmp/rounds.dat"
for rate in $RATES; do
	for r in $(seq "$ROUNDS"); do
		if [ $((r % 2)) = 1 ]; then order="journal syncwrites"; else order="syncwrites journal"; fi
		for mode in $order; do
			round "$rate" "$r" "$mode"
		done
	done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

# mode_median RATE MODE COLUMN: the median of a column over the rounds of
# RATE in MODE.
mode_median() { awk -v rt="$1" -v m="$2" -v c="$3" '$1 == rt && $2 == m { print $c }' "$tmp/rounds.dat" | median 1; }
echo "== medians of $ROUNDS rounds each; ratio: syncwrites/journal"
printf '%5s %-10s %8s %8s %8s %8s\n' rate mode p50 p99 p99.9 "cpu µs"
for rate in $RATES; do
	for mode in journal syncwrites; do
		echo "$rate $mode $(mode_median "$rate" "$mode" 4) $(mode_median "$rate" "$mode" 5) $(mode_median "$rate" "$mode" 6) $(mode_median "$rate" "$mode" 7)"
	done | awk '{ printf "%5d %-10s %8.2f %8.2f %8.2f %8.1f\n", $1, $2, $3 / 1000, $4 / 1000, $5 / 1000, $6
		for (i = 3; i <= 6; i++) v[NR, i] = $i }
		END { printf "%5d %-10s", $1, "ratio"
			for (i = 3; i <= 6; i++) printf " %7.2fx", (v[1, i] ? v[2, i] / v[1, i] : 0)
			printf "\n" }'
done
awk '{ if ($9 < 0) unknown++; else if ($8 > $9) lost++ }
	END { printf "durable: %s (the 200s of a round at most its stored count)%s\n", (lost ? "NO in " lost " round(s)" : (unknown ? "yes in the rounds whose /metrics answered" : "yes, every round")),
		(unknown ? "; " unknown " round(s) unknown: /metrics did not answer" : "") }' "$tmp/rounds.dat"
