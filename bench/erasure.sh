#!/usr/bin/env bash
# Payload erasure: how long the bytes of a result whose payload keep_payload
# erased stay in the store's files while pingbacks keep arriving at
# RATE/s (erasure is an ordinary write: the old bytes leave as Badger
# compacts its tree and checkpoints its journal, or as PostgreSQL's
# autovacuum and checkpoints recycle the pages and WAL).
#
#   bash bench/erasure.sh                    # Badger, in a fresh temp dir under BENCH_DIR
#   STORE=postgres bash bench/erasure.sh     # PostgreSQL: a cluster of .ci/postgres (PINGBACK_TEST_PG_DSN,
#                                            # PINGBACK_PG_DIR exported), in a fresh schema
#
# It starts Caddy (admin localhost:2997, HTTP :9098, app :9099 answering
# 200) with `retention 1h` and `keep_payload KEEP_PAYLOAD` (default 1m),
# sends one pingback whose code is a random marker, then RATE (default 100)
# pingbacks/s with bench/loadgen for up to MAX_SECS (default 900). Every
# 5 s it reads the marker's record from the admin API (payload_erased) and
# greps the store's files for the marker (Badger: the storage directory;
# PostgreSQL: the cluster's data directory, WAL included). It prints one
# line per check that changed something, then: when the payload was erased
# (seconds after the marker was delivered; the sweep runs once a minute) and
# when no file held the marker any more, or that some still did at the end.
set -euo pipefail

STORE=${STORE:-badger}
RATE=${RATE:-100}
KEEP_PAYLOAD=${KEEP_PAYLOAD:-1m}
MAX_SECS=${MAX_SECS:-900}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
ADMIN=localhost:2997
PORT=9098
APP_PORT=9099

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh
tmp=$(mktemp -d "$BENCH_DIR/pingback-erasure.XXXXXX")
caddy_pid=
load_pid=
trap 'stop_pids "$load_pid" "$caddy_pid"; keep_or_remove "$tmp"' EXIT

case $STORE in
badger)
	files=$tmp/data
	store="storage_dir $files"
	;;
postgres)
	: "${PINGBACK_TEST_PG_DSN:?STORE=postgres needs a cluster: source the output of bash .ci/postgres start}"
	: "${PINGBACK_PG_DIR:?STORE=postgres needs PINGBACK_PG_DIR (bash .ci/postgres start)}"
	files=$PINGBACK_PG_DIR/data
	store="store postgres {
			dsn \"$PINGBACK_TEST_PG_DSN\"
			schema erasure_bench_$$
		}"
	;;
*)
	echo "STORE must be badger or postgres, not $STORE" >&2
	exit 1
	;;
esac

build_binaries "$tmp" bench/loadgen
banner cores cpu memory kernel go commit
echo "store:      $STORE ($(fs_of "$tmp")), keep_payload $KEEP_PAYLOAD, $RATE pingbacks/s"

caddyfile "$ADMIN" "$PORT" "$APP_PORT" log=ERROR "pingback=$store
		retention 1h
		keep_payload $KEEP_PAYLOAD" app >"$tmp/Caddyfile"
launch_caddy "$tmp/caddy" "$tmp/Caddyfile" "$tmp/caddy.log" "$tmp"
if ! wait_until 300 0.1 "$caddy_pid" admin_answers "$ADMIN"; then
	echo "Caddy did not start:" >&2
	cat "$tmp/caddy.log" >&2
	exit 1
fi

marker=ERASEMARK$(od -An -tx1 -N12 /dev/urandom | tr -d ' \n')
id=9$(date +%s)
curl -fsS -o /dev/null -d "id=$id&code=$marker" "http://127.0.0.1:$PORT/cb"
"$tmp/loadgen" -url "http://127.0.0.1:$PORT/cb" -rate "$RATE" -duration "${MAX_SECS}s" -prefix 1 >"$tmp/load.txt" 2>&1 &
load_pid=$!

# record_field FIELD: the marker's record's FIELD from the admin API.
record_field() {
	curl -fsS "http://$ADMIN/pingback/records/2captcha/$id" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"
}
# holders: the files under the store's directory that hold the marker,
# counted by kind (path under the directory, digits as N), e.g.
# "1 N.sst 1 pingback-journal.N" or "1 base/N/N 1 pg_wal/N".
holders() {
	grep -rlaF "$marker" "$files" 2>/dev/null | sed "s#^$files/##; s/[0-9A-F]\{24\}/SEGMENT/; s/[0-9]\+/N/g" | sort | uniq -c | tr -s ' \n' ' ' || true
}

wait_until 100 0.1 "$caddy_pid" sh -c "curl -fsS http://$ADMIN/pingback/records/2captcha/$id | grep -q '\"state\":\"delivered\"'"
start=$(date +%s)
echo "marker delivered; files holding it: $(holders)"
erased_at= gone_at= last=
while :; do
	now=$(($(date +%s) - start))
	if [ -z "$erased_at" ] && [ "$(record_field payload_erased)" = true ]; then
		erased_at=$now
		echo "t=${now}s payload erased in the store"
	fi
	h=$(holders)
	if [ "$h" != "$last" ]; then
		echo "t=${now}s files holding the marker: ${h:-none}"
		last=$h
	fi
	if [ -n "$erased_at" ] && [ -z "$h" ]; then
		gone_at=$now
		break
	fi
	if [ "$now" -ge "$MAX_SECS" ] || ! alive "$caddy_pid"; then
		break
	fi
	sleep 5
done

echo "== result"
echo "payload erased: ${erased_at:-never}s after delivery (keep_payload $KEEP_PAYLOAD, sweep once a minute)"
if [ -n "$gone_at" ]; then
	echo "marker gone from every file: ${gone_at}s after delivery, $((gone_at - erased_at))s after erasure"
else
	echo "marker still in: ${last:-none} after ${now}s (MAX_SECS $MAX_SECS)"
fi
