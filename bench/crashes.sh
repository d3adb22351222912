#!/usr/bin/env bash
# Crash repeats: how many results the app gets twice when Caddy is killed
# (SIGKILL) at random moments under live traffic, and that none answered 200
# is lost.
#
#   bash bench/crashes.sh                    # 20 SIGKILLs, pingbacks at 200/s, SEED=1
#   SEED=7 KILLS=5 bash bench/crashes.sh
#
# What it does: builds ./cmd/caddy and bench/crashapp into a temp dir,
# starts the stand-in app (crashapp app, port APP_PORT, outside Caddy: it
# outlives every crash and appends the Idempotency-Key of every request it
# receives to a log), then Caddy (admin localhost:2987, HTTP port 9088) with
#   /cb -> pingback { provider 2captcha } + reverse_proxy to the app
# on a store under BENCH_DIR, and the sender (crashapp send: open loop at
# RATE pingbacks/s, a new task id each, the answer to each logged). KILLS
# times: Caddy runs for a random time between UP_MIN and UP_MAX ms after it
# is ready (the admin API answers /pingback/status), then gets SIGKILL and
# is started again at once on the same store. The random times come from
# bash's RANDOM seeded with SEED, so a seed gives the same schedule. After
# the last kill Caddy runs on, the sender stops TAIL seconds later, and the
# script waits (up to DRAIN seconds) until every result answered 200 has
# reached the app and the store holds none queued, forwarding or failed;
# then it counts, from the two logs:
#   sent          pingbacks sent, answered 200, refused or cut (no answer)
#   twice         results the app received more than once (by
#                 Idempotency-Key), and the extra deliveries in all
#   lost          answered 200 and never delivered: must be 0
# A result sent but not answered (its connection cut by a kill) may still
# be stored and delivered; it is counted apart and is not a loss.
#
# Environment: SEED (1), KILLS (20), RATE (200), UP_MIN (500), UP_MAX
# (3000), TAIL (3), DRAIN (120), BENCH_DIR (/var/tmp), KEEP (1: keep the
# temp dir with the logs).
set -euo pipefail

SEED=${SEED:-1}
KILLS=${KILLS:-20}
RATE=${RATE:-200}
UP_MIN=${UP_MIN:-500}
UP_MAX=${UP_MAX:-3000}
TAIL=${TAIL:-3}
DRAIN=${DRAIN:-120}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
KEEP=${KEEP:-}

ADMIN=localhost:2987
PORT=9088
APP_PORT=9089

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

tmp=$(mktemp -d "$BENCH_DIR/pingback-crashes.XXXXXX")
caddy_pid=
app_pid=
send_pid=
cleanup() {
	stop_pids "$send_pid" "$caddy_pid" "$app_pid"
	keep_or_remove "$tmp"
}
trap cleanup EXIT

echo "== machine"
banner cores
storage_line "$tmp/data" "$tmp"
banner go commit

echo "== building ./cmd/caddy and bench/crashapp"
build_binaries "$tmp" bench/crashapp

caddyfile "$ADMIN" "$PORT" "$APP_PORT" https=9448 "pingback=storage_dir $tmp/data" >"$tmp/Caddyfile"

"$tmp/crashapp" app -listen "127.0.0.1:$APP_PORT" -log "$tmp/received.log" >"$tmp/app.log" 2>&1 &
app_pid=$!

# start_caddy: Caddy on the store, until its admin API answers (the store is
# open); sets caddy_pid and up_ms (how long that took).
start_caddy() {
	local t0
	t0=$(date +%s%N)
	launch_caddy "$tmp/caddy" "$tmp/Caddyfile" "$tmp/caddy.log" "$tmp"
	if wait_until 300 0.05 "$caddy_pid" admin_answers "$ADMIN"; then
		up_ms=$((($(date +%s%N) - t0) / 1000000))
		return 0
	fi
	echo "caddy did not come up; its log:" >&2
	tail -50 "$tmp/caddy.log" >&2
	exit 1
}

# records STATE: the caddy_pingback_records{state} gauge, summed over providers.
records() {
	curl -fsS "http://$ADMIN/metrics" | awk -v s="state=\"$1\"" '/^caddy_pingback_records\{/ && index($0, s) { n += $NF } END { print n + 0 }'
}

start_caddy
echo "start-up:   $up_ms ms (first start, empty store)"
"$tmp/crashapp" send -url "http://127.0.0.1:$PORT/cb" -rate "$RATE" -log "$tmp/sent.log" >"$tmp/send.out" 2>&1 &
send_pid=$!

echo "== $KILLS SIGKILLs, Caddy up ${UP_MIN}-${UP_MAX} ms between them (SEED=$SEED), pingbacks at $RATE/s"
RANDOM=$SEED
printf '%-5s %10s %12s\n' kill "up ms" "restart ms"
for k in $(seq "$KILLS"); do
	ms=$((UP_MIN + (RANDOM * 32768 + RANDOM) % (UP_MAX - UP_MIN + 1)))
	sleep "$(awk -v m="$ms" 'BEGIN { printf "%.3f", m / 1000 }')"
	kill -KILL "$caddy_pid"
	wait "$caddy_pid" 2>/dev/null || true
	start_caddy
	printf '%-5s %10d %12d\n' "$k" "$ms" "$up_ms"
done
sleep "$TAIL"
kill -TERM "$send_pid"
wait "$send_pid" || {
	echo "the sender failed:" >&2
	cat "$tmp/send.out" >&2
	exit 1
}
send_pid=
echo "sender:     $(cat "$tmp/send.out")"

# ok_ids: the Idempotency-Keys ("2captcha:<id>") of the pingbacks answered 200.
ok_ids() { awk '$2 >= 200 && $2 < 300 { print "2captcha:" $1 }' "$tmp/sent.log" | sort -u; }
ok_ids >"$tmp/ok.keys"
echo "== waiting (up to ${DRAIN} s) for every 200 to reach the app and the store to settle"
t0=$(date +%s)
while :; do
	cut -d' ' -f1 "$tmp/received.log" | sort -u >"$tmp/received.keys"
	missing=$(comm -23 "$tmp/ok.keys" "$tmp/received.keys" | wc -l)
	pending=$(($(records queued) + $(records forwarding) + $(records failed)))
	if [ "$missing" = 0 ] && [ "$pending" = 0 ]; then
		break
	fi
	if [ $(($(date +%s) - t0)) -ge "$DRAIN" ]; then
		echo "still $missing answered 200 not delivered, $pending stored queued/forwarding/failed after ${DRAIN} s" >&2
		break
	fi
	sleep 1
done
echo "settled after $(($(date +%s) - t0)) s"
# Deliveries started by the last kill's replays may still be in flight for
# a moment: one more second, then the final count.
sleep 1
cut -d' ' -f1 "$tmp/received.log" | sort >"$tmp/received.all"
sort -u "$tmp/received.all" >"$tmp/received.keys"

sent=$(wc -l <"$tmp/sent.log")
ok=$(wc -l <"$tmp/ok.keys")
noanswer=$(awk '$2 == 0' "$tmp/sent.log" | wc -l)
other=$(awk '$2 != 0 && ($2 < 200 || $2 >= 300)' "$tmp/sent.log" | wc -l)
deliveries=$(wc -l <"$tmp/received.all")
distinct=$(wc -l <"$tmp/received.keys")
twice=$(uniq -d "$tmp/received.all" | wc -l)
extra=$((deliveries - distinct))
lost=$(comm -23 "$tmp/ok.keys" "$tmp/received.keys" | wc -l)
unanswered_delivered=$(comm -13 "$tmp/ok.keys" "$tmp/received.keys" | wc -l)
sources=$(awk '{ n[$2]++ } END { for (s in n) printf "%s %d, ", s, n[s] }' "$tmp/received.log" | sed 's/, $//')

echo "== results (SEED=$SEED, $KILLS SIGKILLs)"
echo "sent:                    $sent pingbacks: $ok answered 200, $noanswer without an answer (refused or cut), $other other statuses"
echo "delivered:               $deliveries deliveries of $distinct results (by X-Pingback-Source: $sources)"
echo "delivered but not 200:   $unanswered_delivered (stored before a kill cut the answer: not a loss)"
echo "got twice or more:       $twice results, $extra extra deliveries"
echo "lost (200, never came):  $lost"
curl -fsS "http://$ADMIN/metrics" | grep -E '^caddy_pingback_(callbacks|forwards)_total' >"$tmp/metrics.txt" || true
echo "last Caddy's counters:   $(paste -sd' ' "$tmp/metrics.txt" | sed 's/caddy_pingback_//g')"
if [ "$lost" != 0 ]; then
	echo "LOST: $lost results answered 200 never reached the app:" >&2
	comm -23 "$tmp/ok.keys" "$tmp/received.keys" | head -20 >&2
	KEEP=1
	exit 1
fi
