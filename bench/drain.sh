#!/usr/bin/env bash
# Replay drain: how long the replay loop takes to deliver N failed results
# once the app is back, at replay concurrency C, and what live pingbacks
# see meanwhile.
#
#   bash bench/drain.sh                 # N=10000, concurrency 4 and 16
#   N=2000 CONCURRENCY="4" bash bench/drain.sh
#
# For each concurrency it starts Caddy (admin localhost:2996, HTTP :9096,
# app :9097, a store in a fresh temp dir under BENCH_DIR) with
# `replay { backoff 100ms 100ms; max_attempts 1000000; concurrency C }`,
# takes the app down (it answers 503 while a file exists), sends N
# pingbacks with bench/loadgen (all stored and answered 200, all forwards
# fail), waits until all N have failed once, then brings the app back and
# at the same moment starts LIVE_RATE pingbacks/s of live traffic for
# LIVE_SECS seconds. It prints the drain time (app back until the N-th
# replay delivered, from the forwards_total counter, polled every 50 ms)
# and the live traffic's latency during the drain, next to the same live
# traffic on the idle server afterwards.
set -euo pipefail

N=${N:-10000}
CONCURRENCY=${CONCURRENCY:-4 16}
LIVE_RATE=${LIVE_RATE:-500}
LIVE_SECS=${LIVE_SECS:-6}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
ADMIN=localhost:2996
PORT=9096
APP_PORT=9097

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
tmp=$(mktemp -d "$BENCH_DIR/pingback-drain.XXXXXX")
caddy_pid=
trap 'stop_pids "$caddy_pid"; rm -rf "$tmp"' EXIT

build_binaries "$tmp" bench/loadgen
echo "cores $(nproc), load average $(cut -d' ' -f1-3 /proc/loadavg), store under $BENCH_DIR ($(df --output=fstype "$tmp" | tail -1))"

# counter NAME LABELS: the sum of a metric's samples whose labels match.
counter() {
	curl -fsS "http://$ADMIN/metrics" | awk -v n="$1" -v l="$2" 'index($0, n) == 1 && $0 ~ l { s += $NF } END { printf "%d\n", s }'
}

for c in $CONCURRENCY; do
	run=$tmp/c$c
	mkdir -p "$run"
	caddyfile "$ADMIN" "$PORT" "$APP_PORT" log=ERROR "pingback=storage_dir $run/data
		replay {
			backoff 100ms 100ms
			max_attempts 1000000
			concurrency $c
		}" app "app-down=$run/app-down" >"$run/Caddyfile"
	touch "$run/app-down"
	launch_caddy "$tmp/caddy" "$run/Caddyfile" "$run/caddy.log" "$run"
	wait_until 100 0.1 "" curl -fsS -o /dev/null "http://$ADMIN/config/" || true

	"$tmp/loadgen" -url "http://127.0.0.1:$PORT/cb" -rate 2000 -duration "$((N / 2))ms" -prefix 1 >"$run/fill.txt"
	failed_want=$N
	for _ in $(seq 600); do
		[ "$(counter caddy_pingback_forwards_total 'source="callback",outcome="failed"|outcome="failed".*source="callback"')" -ge "$failed_want" ] && break
		sleep 0.1
	done
	echo "== concurrency $c: $N results stored and failed ($(grep -o 'non2xx=[0-9]*' "$run/fill.txt"))"

	delivered0=$(counter caddy_pingback_forwards_total 'outcome="delivered".*source="replay"')
	rm "$run/app-down"
	t0=$(date +%s%N)
	"$tmp/loadgen" -url "http://127.0.0.1:$PORT/cb" -rate "$LIVE_RATE" -duration "${LIVE_SECS}s" -prefix 2 >"$run/live-drain.txt" &
	live=$!
	drained=
	while :; do
		d=$(counter caddy_pingback_forwards_total 'outcome="delivered".*source="replay"')
		if [ $((d - delivered0)) -ge "$N" ]; then
			drained=$(( ($(date +%s%N) - t0) / 1000000 ))
			break
		fi
		if [ $(( ($(date +%s%N) - t0) / 1000000000 )) -gt 120 ]; then
			echo "not drained within 120 s ($((d - delivered0)) of $N)" >&2
			break
		fi
		sleep 0.05
	done
	wait "$live"
	echo "drain: $N replays delivered in ${drained:-?} ms at concurrency $c ($(awk -v n="$N" -v ms="${drained:-0}" 'BEGIN { if (ms > 0) printf "%.0f/s", n / ms * 1000 }'))"
	"$tmp/loadgen" -url "http://127.0.0.1:$PORT/cb" -rate "$LIVE_RATE" -duration "${LIVE_SECS}s" -prefix 3 >"$run/live-idle.txt"
	for f in live-drain live-idle; do
		awk -v f="$f" '/^RESULT/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
			printf "live %s at %s/s: p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.2f ms, non-2xx %d\n",
				(f == "live-drain" ? "during the drain" : "after it, idle"), "'"$LIVE_RATE"'",
				v["p50_us"] / 1000, v["p99_us"] / 1000, v["p999_us"] / 1000, v["max_us"] / 1000, v["non2xx"] + v["errors"] }' "$run/$f.txt"
	done
	stop_pids "$caddy_pid"
	caddy_pid=
done
