# Row versions per 1,000 pingbacks on the PostgreSQL store, sourced by
# bench/run-postgres.sh when CHURN=1 (which starts the cluster, builds
# Caddy and writes the Caddyfiles): how many row versions the pingbacks
# leave in `records` and in the count tables (record_counts, task_counts,
# and last_callbacks up to schema version 10, record_totals from 11 on:
# those the schema has), at a steady rate, with and without another
# session's long REPEATABLE READ transaction open.
#
#   CHURN=1 bash bench/run-postgres.sh                  # 6000 pingbacks at 100/s per phase
#   CHURN=1 COUNT=3000 PHASES="none long" bash bench/run-postgres.sh
#
# Each phase of PHASES (default "none long") runs in turn on the run's
# fresh schema:
#   none  no other transaction open
#   long  another session holds `BEGIN ISOLATION LEVEL REPEATABLE READ;
#         SELECT 1;` (a snapshot taken, so no row version that dies during
#         the phase can be pruned or vacuumed) from before the first
#         pingback until the figures are read
# A phase reads pg_stat_user_tables of the schema, starts Caddy A alone
# (its /cb: `pingback { provider 2captcha }` + reverse_proxy to the app, a
# site of the same Caddy; the run's POOLER and EXEC_MODE apply), sends
# COUNT pingbacks with new ids at RATE per second (bench/loadgen, open
# loop), waits until no record is left forwarding, stops Caddy and reads
# the statistics again. A backend's table statistics reach
# pg_stat_user_tables when it flushes them (at most once a second, at
# idle, or at exit); stopping Caddy ends its connections, so every backend
# that wrote has flushed before the second read (the reading session calls
# pg_stat_force_next_flush() for its own). The phase's pingbacks are the
# records it added (the exact count(*); a few readiness probes included).
#
# It prints per phase and table, per 1,000 pingbacks:
#   written   row versions written: n_tup_ins + n_tup_upd
#   hot       of the updates, heap-only ones (n_tup_hot_upd / n_tup_upd)
#   deleted   n_tup_del
#   kept      growth of n_live_tup + n_dead_tup: versions still in the
#             table when the phase ends (page pruning and vacuum take dead
#             versions away, and lower n_dead_tup, only when no snapshot
#             can still see them). These two are estimates: an ANALYZE
#             (autovacuum's too) replaces them with its sample's figures
#   exact     growth of tuple_count + dead_tuple_count of pgstattuple (a
#             scan of the table: every version still on its pages), when
#             the extension can be created (the throw-away cluster's
#             superuser; "-" otherwise)
#   dead      n_dead_tup at the end (absolute)
#
# Environment (with CHURN=1): COUNT (6000 per phase), RATE (100 per
# second), LG_CONNS (16), PHASES ("none long").

COUNT=${COUNT:-6000}
RATE=${RATE:-100}
LG_CONNS=${LG_CONNS:-16}
PHASES=${PHASES:-none long}
TABLES="records record_counts task_counts last_callbacks record_totals"
# The statistics and pgstattuple are read as the throw-away cluster's
# superuser when there is one.
stats_dsn=${PINGBACK_TEST_PG_ADMIN_DSN:-$dsn}
if [ -n "${PINGBACK_BENCH_PG_DSN:-}" ]; then stats_dsn=$dsn; fi
caddy_pid=
holder_pid=
holder_backend=

stop_caddy() {
	stop_pids "$caddy_pid"
	caddy_pid=
}
end_holder() {
	if [ -n "$holder_pid" ]; then
		exec 7>&- # psql reads EOF, ends the transaction and exits
		wait "$holder_pid" 2>/dev/null || true
	fi
	holder_pid=
}
# churn_cleanup: run-postgres.sh's cleanup calls it.
churn_cleanup() {
	stop_caddy
	end_holder
}

# start_caddy: one Caddy on the schema, ready when a pingback is stored.
start_caddy() {
	launch_caddy "$tmp/caddy" "$tmp/Caddyfile.a" "$tmp/caddy.log" "$tmp"
	if wait_until 300 0.1 "$caddy_pid" ready_pingback; then
		return 0
	fi
	echo "caddy did not come up; log:" >&2
	cat "$tmp/caddy.log" >&2
	exit 1
}

# ready_pingback: Caddy A stores a pingback (a new task id each time).
ready_pingback() { curl -fsS -o /dev/null -d "id=9$(date +%s%N)&code=ready" "http://127.0.0.1:$PORT_A/cb"; }

# sql QUERY: one value or rows, unaligned, from a fresh session.
sql() { psql "$stats_dsn" -v ON_ERROR_STOP=1 -Atc "$1"; }

# stats: "table ins upd hot_upd del live dead" for each of TABLES, then
# "pingbacks N" (records by count(*)).
stats() {
	local list
	list=$(printf "'%s'," $TABLES)
	psql "$stats_dsn" -v ON_ERROR_STOP=1 -At -F ' ' <<EOF
SELECT pg_stat_force_next_flush();
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_live_tup, n_dead_tup
	FROM pg_stat_user_tables WHERE schemaname = '$schema' AND relname IN (${list%,}) ORDER BY relname;
SELECT 'pingbacks', count(*) FROM $schema.records;
EOF
	if [ -n "$exact" ]; then
		for t in $TABLES; do
			[ "$(sql "SELECT to_regclass('$schema.$t') IS NOT NULL")" = t ] || continue
			sql "SELECT 'exact $t', tuple_count + dead_tuple_count FROM $schema.pgstattuple('$schema.$t')" | tr '|' ' '
		done
	fi
}

# wait_idle: until no record is forwarding (every outcome written).
wait_idle() {
	for _ in $(seq 600); do
		[ "$(sql "SELECT count(*) FROM $schema.records WHERE state = 'forwarding'")" = 0 ] && return 0
		sleep 0.1
	done
	echo "records still forwarding after 60 s" >&2
	exit 1
}

# wait_gone: until Caddy's connections to the database have ended (their
# backends flush their statistics on exit).
wait_gone() {
	local others
	for _ in $(seq 300); do
		others=$(sql "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND backend_type = 'client backend' AND pid <> pg_backend_pid()
			AND pid IS DISTINCT FROM ${holder_backend:-NULL}")
		[ "$others" = 0 ] && return 0
		sleep 0.1
	done
	echo "database sessions still open 30 s after Caddy stopped" >&2
	exit 1
}

# hold: opens the long REPEATABLE READ transaction on fd 7 and waits until
# it has taken its snapshot (its backend_xmin is set, idle in transaction).
hold() {
	mkfifo "$tmp/holder.fifo"
	psql "$dsn" -qAt <"$tmp/holder.fifo" >"$tmp/holder.out" 2>&1 &
	holder_pid=$!
	exec 7>"$tmp/holder.fifo"
	rm "$tmp/holder.fifo"
	echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1; SELECT pg_backend_pid();" >&7
	for _ in $(seq 100); do
		holder_backend=$(sed -n 2p "$tmp/holder.out")
		if [ -n "$holder_backend" ] && [ "$(sql "SELECT state = 'idle in transaction' AND backend_xmin IS NOT NULL
			FROM pg_stat_activity WHERE pid = $holder_backend")" = t ]; then
			return 0
		fi
		sleep 0.1
	done
	echo "the long transaction did not start:" >&2
	cat "$tmp/holder.out" >&2
	exit 1
}

# churn: the phases, their figures printed.
churn() {
	go build -o "$tmp/loadgen" ./bench/loadgen
	echo "load:       $COUNT pingbacks per phase at $RATE/s, phases: $PHASES"
	# Schema first (a Caddy that starts and stops), so that every phase starts
	# from a schema whose statistics exist.
	start_caddy
	wait_idle
	stop_caddy
	wait_gone
	exact=
	if psql "$stats_dsn" -qc "CREATE EXTENSION IF NOT EXISTS pgstattuple SCHEMA $schema" 2>/dev/null; then exact=1; fi

	for phase in $PHASES; do
		case $phase in none | long) ;; *)
			echo "unknown phase $phase (none, long)" >&2
			exit 2
			;;
		esac
		holder_backend=
		if [ "$phase" = long ]; then hold; fi
		stats >"$tmp/$phase.before"
		start_caddy
		secs=$(awk -v n="$COUNT" -v r="$RATE" 'BEGIN { printf "%.3f", n / r }')
		"$tmp/loadgen" -url "http://127.0.0.1:$PORT_A/cb" -rate "$RATE" -duration "${secs}s" -conns "$LG_CONNS" \
			-prefix "$(date +%s%3N)" >"$tmp/$phase.loadgen" 2>&1 || {
			cat "$tmp/$phase.loadgen" >&2
			exit 1
		}
		wait_idle
		stop_caddy
		wait_gone
		stats >"$tmp/$phase.after"
		end_holder
		echo "== phase $phase: $(grep '^RESULT' "$tmp/$phase.loadgen" | cut -d' ' -f2-6)"
		awk '
			FNR == 1 { f++ }
			NF == 2 && $1 == "pingbacks" { n[f] = $2; next }
			NF == 3 && $1 == "exact" { x[f, $2] = $3; next }
			NF == 7 { for (i = 2; i <= 7; i++) v[f, $1, i] = $i; if (f == 1) t[++nt] = $1 }
			END {
				p = n[2] - n[1]
				printf "pingbacks stored: %d\n", p
				printf "%-15s %9s %9s %9s %9s %9s %9s\n", "per 1,000", "written", "hot/upd", "deleted", "kept", "exact", "dead"
				for (k = 1; k <= nt; k++) {
					r = t[k]
					ins = v[2, r, 2] - v[1, r, 2]; upd = v[2, r, 3] - v[1, r, 3]; hot = v[2, r, 4] - v[1, r, 4]
					del = v[2, r, 5] - v[1, r, 5]
					kept = (v[2, r, 6] + v[2, r, 7]) - (v[1, r, 6] + v[1, r, 7])
					ex = ((2, r) in x) ? sprintf("%.0f", 1000 * (x[2, r] - x[1, r]) / p) : "-"
					printf "%-15s %9.0f %9s %9.0f %9.0f %9s %9d\n", r, 1000 * (ins + upd) / p,
						(upd > 0 ? sprintf("%.2f", hot / upd) : "-"), 1000 * del / p, 1000 * kept / p, ex, v[2, r, 7]
				}
			}' "$tmp/$phase.before" "$tmp/$phase.after"
	done
	psql "$dsn" -qc "DROP SCHEMA $schema CASCADE" 2>/dev/null || true
}
