#!/usr/bin/env bash
# PostgreSQL at a day's size: the insert rate of a fill of N results, the
# plans of the claim and list queries on them, and the sizes of the tables
# and indexes.
#
#   bash bench/day-postgres.sh                       # 5,000,000 results, a throw-away cluster
#   N=20000 bash bench/day-postgres.sh               # a smoke run
#   PINGBACK_BENCH_PG_DSN=postgres://... WORKERS=128 bash bench/day-postgres.sh
#
# What it does: gets a PostgreSQL as bench/run-postgres.sh does (the
# database PINGBACK_BENCH_PG_DSN names, or else a throw-away cluster
# started with .ci/postgres and stopped at the end), builds bench/fill and
# fills a fresh schema with N delivered results plus 100 parked and 100
# failed (due in a day), their receipt times spread over the last day,
# and a day of history minutes, through the plugin's own insert path
# (bench/fill -postgres: Store.Insert, then the outcome update, from
# WORKERS goroutines on the store's pool). It prints:
#   - the insert rate: overall, and per million from fill's progress lines
#     (per N/4 when N is under 2,000,000), and fill's timings of the reads
#     after it (list parked, the due scan, the paged scan of every record);
#   - after ANALYZE of the schema's tables (what autovacuum does soon after
#     such a fill), EXPLAIN (ANALYZE, BUFFERS) of the queries the plugin
#     runs, their SQL as internal/store/pgstore builds it (PREPAREd with
#     the parameter types pgx sends, so the text is the store's own, $n
#     and all; run in a transaction that is rolled back, since the claim
#     locks rows): the claim's three passes (Postgres.Claim: lapsed leases,
#     the fair pass, due records), the admin API's page of records by state
#     and its next page (ListPage, for a rare state and for delivered), the
#     bulk replay's list (List, state parked), the lookup of a record and
#     of a task by provider and id (Get, GetTask), and /pingback/status's
#     counts (Counts' two statements and Ages). Each plan is followed by
#     MET (no "Seq Scan on records") or MISSED, and a summary lists them
#     with their execution times and buffers;
#   - the same queries again after VACUUM (ANALYZE) of the schema's
#     tables, summary only: the fill leaves a dead index entry per result
#     in the partial indexes of records in flight (records_forwarding,
#     records_lease, records_backlog: each result was inserted forwarding
#     and then delivered) until vacuum or the first scans clear them, and
#     the first pass pays for them;
#   - the size of every table and index of the schema
#     (pg_total_relation_size, pg_relation_size, pg_indexes_size) and the
#     schema's bytes per stored result, after that VACUUM.
# The statements here are copies of the store's: when the store's SQL
# changes, change them too (each names the function that builds it).
#
# It starts no Caddy (the ports 2956/9056 are set aside for this script
# and unused); the throw-away cluster takes the first free port from 5440
# (.ci/postgres).
#
# Environment: N (5000000), WORKERS (64: fill's concurrent callers),
# PINGBACK_BENCH_PG_DSN (empty: a throw-away cluster), SCHEMA (empty: a
# fresh bench_day_<time>; the schema is dropped at the end unless
# KEEP_SCHEMA=1), KEEP (1: keep the temp dir with fill's output).
set -euo pipefail

N=${N:-5000000}
WORKERS=${WORKERS:-64}
KEEP=${KEEP:-}
KEEP_SCHEMA=${KEEP_SCHEMA:-}

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

tmp=$(mktemp -d /var/tmp/pingback-day-pg.XXXXXX)
pg_dir=
dsn=${PINGBACK_BENCH_PG_DSN:-}
schema=${SCHEMA:-bench_day_$(date +%s)}
cleanup() {
	if [ -n "$dsn" ] && [ -z "$KEEP_SCHEMA" ]; then
		psql "$dsn" -Xq -c "SET client_min_messages TO warning" -c "DROP SCHEMA IF EXISTS $schema CASCADE" || true
	fi
	if [ -n "$pg_dir" ]; then
		bash .ci/postgres stop "$pg_dir"
	fi
	keep_or_remove "$tmp"
}
trap cleanup EXIT

if [ -z "$dsn" ]; then
	eval "$(bash .ci/postgres start)"
	pg_dir=$PINGBACK_PG_DIR
	dsn=$PINGBACK_TEST_PG_DSN
fi

# q SQL: one statement's rows, unaligned, on the schema.
q() { psql "$dsn" -X -v ON_ERROR_STOP=1 -qAt -c "SET search_path TO $schema" -c "$1"; }

echo "== machine"
banner cores cpu memory kernel go commit
echo "postgres:   $(q 'SHOW server_version') on $(q 'SHOW data_directory' 2>/dev/null || echo '?'), shared_buffers $(q 'SHOW shared_buffers'), synchronous_commit $(q 'SHOW synchronous_commit'), fsync $(q 'SHOW fsync')"
echo "database:   ${PINGBACK_BENCH_PG_DSN:+PINGBACK_BENCH_PG_DSN}${pg_dir:+a throw-away cluster (.ci/postgres) in $pg_dir}, schema $schema"
echo "command:    N=$N WORKERS=$WORKERS bash bench/day-postgres.sh"

echo "== building bench/fill"
go build -o "$tmp/fill" ./bench/fill

progress=1000000
if [ "$N" -lt 2000000 ]; then progress=$((N / 4 > 0 ? N / 4 : 1)); fi
prefix=$(date +%s)
echo "== fill: $N delivered + 100 parked + 100 failed results, $WORKERS workers"
"$tmp/fill" -postgres "$dsn" -schema "$schema" -n "$N" -workers "$WORKERS" \
	-progress "$progress" -prefix "$prefix" | tee "$tmp/fill.txt"
total=$(awk '/^stored [0-9]+ results/ { print $2 }' "$tmp/fill.txt")

echo "== insert rate"
awk '/^stored [0-9]+ results in/ { printf "overall: %s results in %s, %s\n", $2, $5, $6 }' "$tmp/fill.txt" | tr -d '()'
printf '%-14s %12s %12s\n' "results" "rate/s" "overall/s"
# "<done> stored (<rate>/s over the last <step>, <overall>/s overall, <elapsed>)"
awk '/^[0-9]+ stored \(/ {
	rate = $3; sub(/^\(/, "", rate); sub(/\/s$/, "", rate)
	all = $8; sub(/\/s$/, "", all)
	printf "%-14s %12s %12s\n", "to " $1, rate, all
}' "$tmp/fill.txt"

echo "== ANALYZE (last autoanalyze of records before it: $(q "SELECT coalesce(last_autoanalyze::text, 'never') FROM pg_stat_user_tables WHERE schemaname = '$schema' AND relname = 'records'"))"
for t in $(q "SELECT tablename FROM pg_tables WHERE schemaname = '$schema' ORDER BY 1"); do
	q "ANALYZE $t"
done

# The store's column lists (pgRecordCols, pgTaskCols).
record_cols="provider, id, code, answer, source, received_at, submitted_at, server, request,
	state, attempts, failures, interrupts, due_at, lease_owner, lease_until, last_status, last_error, updated_at, expires_at, history,
	verified, tracked, quarantine, other_code, correction, payload_erased, expired_reason"
task_cols="provider, id, method, api, submitted_at, pingback_url, server, state, next_poll_at, polls, app_polls, app_polled_at, last_error, updated_at, expires_at, result_at, token, account"
page_order='ORDER BY received_at, provider COLLATE "C", id COLLATE "C"'
now_ns=$(date +%s%N)

# explain NAME TYPES SQL ARGS: EXPLAIN (ANALYZE, BUFFERS) of SQL PREPAREd
# with the parameter TYPES (empty: none) and EXECUTEd with ARGS, in a
# transaction rolled back; then MET or MISSED. With BRIEF set, only its
# line in $tmp/verdicts (verdict, execution time, top node's buffers).
explain() {
	local name=$1 types=$2 sql=$3 args=$4 prep exec plan verdict ms bufs
	prep="PREPARE pb_q AS"
	exec="EXECUTE pb_q"
	if [ -n "$types" ]; then
		prep="PREPARE pb_q($types) AS"
		exec="EXECUTE pb_q($args)"
	fi
	if [ -z "$BRIEF" ]; then echo "-- $name"; fi
	plan=$(psql "$dsn" -X -v ON_ERROR_STOP=1 -qAt <<-SQL
		SET search_path TO $schema;
		BEGIN;
		$prep $sql;
		EXPLAIN (ANALYZE, BUFFERS) $exec;
		ROLLBACK;
	SQL
	)
	echo "$plan" | sed 's/^/   /'
	ms=$(echo "$plan" | awk '/^Execution Time:/ { print $3 }')
	bufs=$(echo "$plan" | awk '/Buffers: shared/ { sub(/^ *Buffers: shared /, ""); print; exit }')
	if grep -q 'Seq Scan on records' <<<"$plan"; then verdict=MISSED; else verdict=MET; fi
	if [ -z "$BRIEF" ]; then
		echo "$plan" | sed 's/^/   /'
		echo "$verdict: $name (no Seq Scan on records), execution $ms ms"
	fi
	printf '%-7s %10s ms  %-22s %s\n' "$verdict" "$ms" "${bufs:--}" "$name" >>"$tmp/verdicts"
}

# A cursor: received_at, provider and id of the 100th row of a page of
# state $1 (the admin API's default limit), as the next page's arguments.
cursor() {
	q "SELECT received_at || ', ' || quote_literal(provider) || ', ' || quote_literal(id) FROM records
		WHERE state = '$1' $page_order OFFSET 99 LIMIT 1"
}

# plans: every query's plan (explain), then the summary.
plans() {
	local claim_args claim_types claim_tail state key
	# Postgres.Claim without keys: pgClaimPass.query(false) of each pass, $1
	# the time in ns, $2 $3 the keys taken so far, $4 the chunk, $5 providers
	# skipped.
	claim_args="$now_ns, '{}', '{}', 16, '{}'"
	claim_types="bigint, text[], text[], bigint, text[]"
	claim_tail="AND (provider, id) NOT IN (SELECT * FROM unnest(\$2::text[], \$3::text[]))
			AND provider <> ALL(\$5::text[])"
	explain "claim, lapsed leases (pgLapsedPass)" "$claim_types" \
		"SELECT $record_cols FROM records WHERE state = 'forwarding' AND lease_until <= \$1
			$claim_tail ORDER BY lease_until, provider, id LIMIT \$4 FOR UPDATE SKIP LOCKED" "$claim_args"
	explain "claim, fair pass (pgFairPass)" "$claim_types" \
		"SELECT $record_cols FROM records WHERE state IN ('queued', 'failed') AND failures <= 2 AND due_at <= \$1
			$claim_tail ORDER BY due_at, provider, id LIMIT \$4 FOR UPDATE SKIP LOCKED" "$claim_args"
	explain "claim, due records (pgDuePass)" "$claim_types" \
		"SELECT $record_cols FROM records WHERE state IN ('queued', 'failed') AND due_at <= \$1
			$claim_tail ORDER BY due_at, provider, id LIMIT \$4 FOR UPDATE SKIP LOCKED" "$claim_args"

	# ListPage (pgListWhere): GET /pingback/records?state=S, limit 100 (101
	# rows asked), then cursor= the 100th row.
	for state in failed delivered; do
		explain "records page, state=$state (ListPage)" "text, bigint" \
			"SELECT $record_cols FROM records WHERE state = \$1 $page_order LIMIT \$2" "'$state', 101"
		explain "records next page, state=$state (ListPage, cursor)" "text, bigint, text, text, bigint" \
			"SELECT $record_cols FROM records WHERE state = \$1 AND (received_at, provider COLLATE \"C\", id COLLATE \"C\") > (\$2, \$3, \$4) $page_order LIMIT \$5" \
			"'$state', $(cursor "$state"), 101"
	done
	# List: POST /pingback/replay's selection (state parked, at most
	# maxBulkReplay, 100,000).
	explain "bulk replay list, state=parked (List)" "text, text, bigint" \
		"SELECT $record_cols FROM records WHERE (\$1 = '' OR provider = \$1) AND (\$2 = '' OR state = \$2)
			ORDER BY provider, id LIMIT \$3" "'', 'parked', 100000"
	# Get and GetTask: GET /pingback/records/2captcha/<id> and
	# /pingback/tasks/2captcha/<id> (fill stores no tasks).
	key="'2captcha', '$prefix$((N / 2))'"
	explain "record lookup by provider and id (Get)" "text, text" \
		"SELECT $record_cols FROM records WHERE provider = \$1 AND id = \$2" "$key"
	explain "task lookup by provider and id (GetTask; no tasks stored)" "text, text" \
		"SELECT $task_cols FROM tasks WHERE provider = \$1 AND id = \$2" "$key"
	# GET /pingback/status: Counts (two statements) and Ages.
	explain "status counts, records (Counts)" "" \
		"WITH
			c AS (SELECT provider, state, sum(n)::bigint AS n FROM record_counts
				WHERE state NOT IN ('forwarding', 'delivered') GROUP BY provider, state),
			f AS (SELECT provider, count(*) AS n FROM records WHERE state = 'forwarding' GROUP BY provider),
			t AS (SELECT provider, sum(n)::bigint AS n FROM record_totals GROUP BY provider)
		SELECT provider, state, n FROM (
			SELECT provider, state, n FROM c
			UNION ALL SELECT provider, 'forwarding', n FROM f
			UNION ALL SELECT t.provider, 'delivered', t.n - coalesce(f.n, 0)
				- coalesce((SELECT sum(c.n) FROM c WHERE c.provider = t.provider), 0)
				FROM t LEFT JOIN f ON f.provider = t.provider) v
		WHERE n > 0" ""
	explain "status counts, tasks (Counts)" "" \
		"SELECT provider, account, sum(n)::bigint FROM task_counts
			WHERE state = 'pending' GROUP BY provider, account HAVING sum(n) > 0" ""
	explain "status ages (Ages)" "" \
		"SELECT v.provider,
			(SELECT min(received_at) FROM records r
				WHERE r.provider = v.provider AND r.state IN ('failed', 'forwarding')),
			(SELECT min(submitted_at) FROM tasks t
				WHERE t.provider = v.provider AND t.state = 'pending'),
			(SELECT max(last_callback) FROM record_totals l WHERE l.provider = v.provider)
		FROM (SELECT provider FROM record_totals UNION SELECT provider FROM task_counts) v" ""
	printf '%-7s %13s  %-22s %s\n' verdict execution buffers query
	cat "$tmp/verdicts"
	echo "$(grep -c '^MET' "$tmp/verdicts" || true) MET, $(grep -c '^MISSED' "$tmp/verdicts" || true) MISSED"
}

echo "== plans after the fill and ANALYZE (N=$N; the store's SQL, \$1 = the claim's time $now_ns)"
BRIEF=
: >"$tmp/verdicts"
plans
echo "== plans after VACUUM (ANALYZE): no Seq Scan on records"
for t in $(q "SELECT tablename FROM pg_tables WHERE schemaname = '$schema' ORDER BY 1"); do
	q "VACUUM (ANALYZE) $t"
done
BRIEF=1
: >"$tmp/verdicts"
plans

echo "== sizes after the VACUUM (schema $schema, $total results)"
printf '%-24s %12s %12s %12s %12s\n' table total heap indexes toast
q "SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid), pg_indexes_size(c.oid)
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = '$schema' AND c.relkind = 'r' ORDER BY 2 DESC, 1" |
	awk -F'|' '{ printf "%-24s %12.0f %12.0f %12.0f %12.0f\n", $1, $2, $3, $4, $2 - $3 - $4 }'
printf '%-32s %-16s %12s\n' index table bytes
q "SELECT i.relname, t.relname, pg_relation_size(i.oid)
	FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
	JOIN pg_namespace n ON n.oid = t.relnamespace
	WHERE n.nspname = '$schema' ORDER BY 3 DESC, 1" |
	awk -F'|' '{ printf "%-32s %-16s %12.0f\n", $1, $2, $3 }'
q "SELECT sum(pg_total_relation_size(c.oid)), sum(pg_total_relation_size(c.oid)) FILTER (WHERE c.relname = 'records')
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = '$schema' AND c.relkind = 'r'" |
	awk -F'|' -v n="$total" '{
		printf "schema: %.0f bytes (%.1f MiB), %.0f bytes per result; records with its indexes and TOAST: %.0f bytes per result\n",
			$1, $1 / 1048576, $1 / n, $2 / n
	}'
