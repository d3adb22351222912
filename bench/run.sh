#!/usr/bin/env bash
# Throughput and latency of pingback callbacks through the plugin, against a
# bare reverse_proxy to the same app, in one Caddy process in the same run.
#
#   bash bench/run.sh                  # 5 alternating rounds of 10 s per path
#   ROUNDS=3 DURATION=5s bash bench/run.sh
#   PROFILE=1 bash bench/run.sh        # plus a CPU profile of one more plugin round
#
# What it does: builds ./cmd/caddy into a temp dir, starts it as a child
# process (admin localhost:2996, HTTP port 9096, app port 9097, clear of the
# tests' ports) with a Caddyfile that has
#   /bare -> reverse_proxy to the app
#   /cb   -> pingback { provider 2captcha } + reverse_proxy to the app
#   :9097 -> the app: `respond "ok" 200` (a site of the same Caddy)
# and loads both paths with wrk: CONNS connections, THREADS threads, every
# request a form POST with a NEW task id (bench/post.lua), so every plugin
# request is a durable insert (SyncWrites on) plus an outcome update. Rounds
# alternate bare/plugin (ABBA order) after a warm-up; it prints each round,
# the medians and the plugin/bare ratios. wrk shares the machine's cores
# with Caddy. The store lives in a temp dir under BENCH_DIR (default
# /var/tmp: local disk here, not tmpfs); the script prints its filesystem.
#
# Environment: ROUNDS (5), DURATION (10s), WARMUP (3s), CONNS (32),
# THREADS (2), BENCH_DIR (/var/tmp), PROFILE (empty: no profile),
# KEEP (1: keep the temp dir with the logs and profile).
set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
PROFILE=${PROFILE:-}
KEEP=${KEEP:-}

ADMIN=localhost:2996
PORT=9096
APP_PORT=9097

cd "$(dirname "$0")/.."
repo=$(pwd)

if ! command -v wrk >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "wrk not found; installing the Debian package" >&2
		apt-get update -qq && apt-get install -y -qq wrk >/dev/null
	else
		echo "wrk not found: install it (Debian: apt-get install wrk)" >&2
		exit 1
	fi
fi

tmp=$(mktemp -d "$BENCH_DIR/pingback-bench.XXXXXX")
caddy_pid=
cleanup() {
	if [ -n "$caddy_pid" ] && kill -0 "$caddy_pid" 2>/dev/null; then
		kill "$caddy_pid" 2>/dev/null || true
		wait "$caddy_pid" 2>/dev/null || true
	fi
	if [ -n "$KEEP" ]; then
		echo "kept $tmp"
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT

echo "== machine"
echo "cores:      $(nproc)"
echo "cpu:        $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "storage:    $tmp/data ($(df --output=fstype "$tmp" | tail -1) on $(df --output=source "$tmp" | tail -1), mount options $(findmnt -no OPTIONS -T "$tmp"))"
echo "go:         $(go version)"
echo "wrk:        $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2)"

echo "== building ./cmd/caddy"
go build -o "$tmp/caddy" ./cmd/caddy

cat >"$tmp/Caddyfile" <<EOF
{
	admin $ADMIN
	http_port $PORT
	https_port 9446
	auto_https off
	skip_install_trust
	persist_config off
	log {
		level WARN
	}
	pingback {
		storage_dir $tmp/data
	}
}
http://:$PORT {
	handle /bare {
		reverse_proxy 127.0.0.1:$APP_PORT
	}
	handle /cb {
		pingback {
			provider 2captcha
		}
		reverse_proxy 127.0.0.1:$APP_PORT
	}
	respond 404
}
http://:$APP_PORT {
	respond "ok" 200
}
EOF

XDG_DATA_HOME=$tmp/xdg-data XDG_CONFIG_HOME=$tmp/xdg-config \
	"$tmp/caddy" run --config "$tmp/Caddyfile" --adapter caddyfile >"$tmp/caddy.log" 2>&1 &
caddy_pid=$!

ready=
for _ in $(seq 100); do
	if curl -fsS -o /dev/null "http://127.0.0.1:$PORT/bare" 2>/dev/null &&
		curl -fsS -o /dev/null -d "id=1&code=ready" "http://127.0.0.1:$PORT/cb" 2>/dev/null; then
		ready=1
		break
	fi
	kill -0 "$caddy_pid" 2>/dev/null || break
	sleep 0.1
done
if [ -z "$ready" ]; then
	echo "caddy did not come up; its log:" >&2
	cat "$tmp/caddy.log" >&2
	exit 1
fi

# caddy_cpu: CPU time (user+system, clock ticks) Caddy has used so far.
caddy_cpu() { awk '{ print $14 + $15 }' "/proc/$caddy_pid/stat"; }
hz=$(getconf CLK_TCK)

# load PATH DURATION TAG: one wrk run; prints
# "reqs_per_s p50_us p99_us caddy_cpu_us_per_request".
# Every run gets its own id prefix (the start time in ms, 13 digits) so no
# id repeats across runs.
load() {
	local path=$1 dur=$2 tag=$3 out cpu0 cpu1
	out="$tmp/wrk-$tag.txt"
	cpu0=$(caddy_cpu)
	BENCH_PREFIX="$(date +%s%3N)" \
		wrk -t "$THREADS" -c "$CONNS" -d "$dur" --latency -s bench/post.lua \
		"http://127.0.0.1:$PORT$path" >"$out" 2>&1
	cpu1=$(caddy_cpu)
	local line
	line=$(grep '^RESULT ' "$out") || {
		echo "wrk gave no result:" >&2
		cat "$out" >&2
		exit 1
	}
	local errs
	errs=$(echo "$line" | awk '{for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] != "requests" && kv[1] !~ /_us$/) s += kv[2] } print s + 0}')
	if [ "$errs" != 0 ]; then
		echo "warning: $tag had errors: $line" >&2
	fi
	echo "$line" | awk -v cpu=$((cpu1 - cpu0)) -v hz="$hz" '{
		for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		printf "%.0f %d %d %.0f\n", v["requests"] / (v["duration_us"] / 1e6), v["p50_us"], v["p99_us"],
			cpu * 1e6 / hz / v["requests"]
	}'
}

echo "== warm-up ($WARMUP per path)"
load /bare "$WARMUP" warmup-bare >/dev/null
load /cb "$WARMUP" warmup-cb >/dev/null

echo "== $ROUNDS rounds of $DURATION per path, $CONNS connections, $THREADS wrk threads"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-7s %9s %8s %8s %10s\n' round path "req/s" "p50 ms" "p99 ms" "CPU us/req"
: >"$tmp/bare.dat"
: >"$tmp/cb.dat"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="bare cb"; else order="cb bare"; fi
	for p in $order; do
		res=$(load "/$p" "$DURATION" "round$r-$p")
		echo "$res" >>"$tmp/$p.dat"
		name=bare
		[ "$p" = cb ] && name=plugin
		echo "$res" | awk -v r="$r" -v n="$name" \
			'{ printf "%-6s %-7s %9d %8.2f %8.2f %10d\n", r, n, $1, $2 / 1000, $3 / 1000, $4 }'
	done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

# median COLUMN FILE
median() {
	sort -g -k"$1","$1" "$2" | awk -v c="$1" '{ v[NR] = $c } END {
		if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# The same round's plugin/bare ratios: throughput, p50, p99, CPU.
paste -d' ' "$tmp/cb.dat" "$tmp/bare.dat" |
	awk '{ printf "%.4f %.4f %.4f %.4f\n", $1 / $5, $2 / $6, $3 / $7, $4 / $8 }' >"$tmp/ratio.dat"

echo "== medians of $ROUNDS rounds"
printf '%-8s %9s %8s %8s %10s\n' path "req/s" "p50 ms" "p99 ms" "CPU us/req"
for p in bare cb; do
	name=bare
	[ "$p" = cb ] && name=plugin
	awk -v n="$name" -v a="$(median 1 "$tmp/$p.dat")" -v b="$(median 2 "$tmp/$p.dat")" \
		-v c="$(median 3 "$tmp/$p.dat")" -v d="$(median 4 "$tmp/$p.dat")" \
		'BEGIN { printf "%-8s %9d %8.2f %8.2f %10d\n", n, a, b / 1000, c / 1000, d }'
done
awk -v br="$(median 1 "$tmp/bare.dat")" -v cr="$(median 1 "$tmp/cb.dat")" \
	-v b9="$(median 3 "$tmp/bare.dat")" -v c9="$(median 3 "$tmp/cb.dat")" \
	-v rt="$(median 1 "$tmp/ratio.dat")" -v r5="$(median 2 "$tmp/ratio.dat")" \
	-v r9="$(median 3 "$tmp/ratio.dat")" -v rc="$(median 4 "$tmp/ratio.dat")" 'BEGIN {
	t = cr / br; l = c9 / b9
	printf "plugin/bare, ratio of the medians:    throughput %.2fx (aim >= 0.70), p99 %.2fx (aim <= 1.50)\n", t, l
	printf "plugin/bare, median of round ratios:  throughput %.2fx, p50 %.2fx, p99 %.2fx, Caddy CPU per request %.2fx\n", rt, r5, r9, rc
	printf "aim: throughput %s, p99 %s\n", (t >= 0.7 ? "met" : "MISSED"), (l <= 1.5 ? "met" : "MISSED")
}'

# Every plugin request must have been a new id that was stored: no
# duplicates, no invalid ones, no store errors.
echo "== plugin counters (admin /metrics)"
curl -fsS "http://$ADMIN/metrics" | grep -E '^caddy_pingback_(callbacks|forwards)_total' || echo "(no pingback metrics)"

if [ -n "$PROFILE" ]; then
	secs=$((${DURATION%s} > 4 ? ${DURATION%s} - 2 : 2))
	echo "== CPU profile of one more plugin round (${secs}s of it)"
	load /cb "$DURATION" profile-cb >"$tmp/profile-round.txt" &
	load_pid=$!
	sleep 1
	curl -fsS -o "$tmp/cpu.pprof" "http://$ADMIN/debug/pprof/profile?seconds=$secs"
	wait "$load_pid"
	echo "round: $(cat "$tmp/profile-round.txt") (req/s p50_us p99_us CPU_us/req)"
	go tool pprof -top -cum -nodecount=40 "$tmp/caddy" "$tmp/cpu.pprof" 2>/dev/null | head -50
	echo "profile: $tmp/cpu.pprof (binary $tmp/caddy)"
	KEEP=1
fi
