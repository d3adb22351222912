# What the bench scripts share (bench/run.sh, run-postgres.sh and the
# pg-churn-phases.sh it sources, memory.sh, day.sh, crashes.sh, drain.sh):
# the machine banner's lines, the build, the Caddyfile of a bench Caddy,
# starting, awaiting and stopping processes, memory cgroups, wrk's result
# line and medians.
# Sourced from the repository's root after `cd`; it defines functions and
# runs nothing.

# need_wrk: wrk is on PATH, or is installed from the Debian package when
# the script runs as root on a machine with apt-get; otherwise the script
# stops.
need_wrk() {
	if command -v wrk >/dev/null; then
		return 0
	fi
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "wrk not found; installing the Debian package" >&2
		apt-get update -qq && apt-get install -y -qq wrk >/dev/null
	else
		echo "wrk not found: install it (Debian: apt-get install wrk)" >&2
		exit 1
	fi
}

# banner LINE...: lines of the "== machine" banner, in the order given:
# cores, cpu, memory (RAM and swap), kernel, go, wrk, commit.
banner() {
	local line
	for line; do
		case $line in
		cores) echo "cores:      $(nproc)" ;;
		cpu) echo "cpu:        $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" ;;
		memory) echo "memory:     $(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), swap $(awk '/^SwapTotal/ { printf "%d MiB", $2 / 1024 }' /proc/meminfo)" ;;
		kernel) echo "kernel:     $(uname -r)" ;;
		go) echo "go:         $(go version)" ;;
		wrk) echo "wrk:        $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2)" ;;
		commit) echo "commit:     $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" ;;
		*)
			echo "banner: no line $line" >&2
			return 1
			;;
		esac
	done
}

# fs_of DIR: "<type> on <device>" of the filesystem DIR is on.
fs_of() { echo "$(df --output=fstype "$1" | tail -1) on $(df --output=source "$1" | tail -1)"; }

# storage_line SHOWN DIR [mount]: the banner's storage line: SHOWN and the
# filesystem DIR is on, with its mount options when the third argument is
# "mount".
storage_line() {
	if [ "${3:-}" = mount ]; then
		echo "storage:    $1 ($(fs_of "$2"), mount options $(findmnt -no OPTIONS -T "$2"))"
	else
		echo "storage:    $1 ($(fs_of "$2"))"
	fi
}

# build_binaries DIR [PACKAGE...]: ./cmd/caddy built into DIR/caddy, and each
# PACKAGE (bench/loadgen, ...) into DIR/<its last element>.
build_binaries() {
	local dir=$1 pkg
	shift
	go build -o "$dir/caddy" ./cmd/caddy
	for pkg; do
		go build -o "$dir/${pkg##*/}" "./$pkg"
	done
}

# caddyfile ADMIN PORT APP_PORT [OPTION...]: the Caddyfile of a bench Caddy
# on stdout: admin on ADMIN, HTTP on PORT, no automatic HTTPS, no trust
# store, no persisted config; the pingback route /cb (the handler with
# provider 2captcha, then reverse_proxy to 127.0.0.1:APP_PORT) and 404 for
# the rest. Options:
#   pingback=TEXT  the body of the global pingback block (storage_dir DIR, a
#                  store block, a replay block): required
#   https=N        https_port N (default: Caddy's)
#   log=LEVEL      the log level (default WARN)
#   bare           a route /bare: reverse_proxy to the app, no plugin
#   app            the app as a site of this Caddy on APP_PORT: "ok", 200
#   app-down=FILE  with app: the app answers 503 "down" while FILE exists
caddyfile() {
	local admin=$1 port=$2 app_port=$3 opt pingback= https= level=WARN bare= app= down=
	shift 3
	for opt; do
		case $opt in
		pingback=*) pingback=${opt#pingback=} ;;
		https=*) https=${opt#https=} ;;
		log=*) level=${opt#log=} ;;
		bare) bare=1 ;;
		app) app=1 ;;
		app-down=*) down=${opt#app-down=} ;;
		*)
			echo "caddyfile: unknown option $opt" >&2
			return 1
			;;
		esac
	done
	printf '{\n\tadmin %s\n\thttp_port %s\n' "$admin" "$port"
	if [ -n "$https" ]; then printf '\thttps_port %s\n' "$https"; fi
	cat <<EOF
	auto_https off
	skip_install_trust
	persist_config off
	log {
		level $level
	}
	pingback {
		$pingback
	}
}
http://:$port {
EOF
	if [ -n "$bare" ]; then
		printf '\thandle /bare {\n\t\treverse_proxy 127.0.0.1:%s\n\t}\n' "$app_port"
	fi
	cat <<EOF
	handle /cb {
		pingback {
			provider 2captcha
		}
		reverse_proxy 127.0.0.1:$app_port
	}
	respond 404
}
EOF
	if [ -z "$app" ]; then
		return 0
	fi
	printf 'http://:%s {\n' "$app_port"
	if [ -n "$down" ]; then
		printf '\t@down file {\n\t\troot /\n\t\ttry_files %s\n\t}\n\trespond @down "down" 503\n' "$down"
	fi
	printf '\trespond "ok" 200\n}\n'
}

# launch_caddy BINARY CONFIG LOG STATE [WRAPPER...]: starts Caddy in the
# background on the Caddyfile CONFIG, its output appended to LOG, its data
# and config directories under STATE, run through WRAPPER if given
# (taskset, a cgroup's shell); sets caddy_pid.
launch_caddy() {
	local bin=$1 config=$2 log=$3 state=$4
	shift 4
	XDG_DATA_HOME=$state/xdg-data XDG_CONFIG_HOME=$state/xdg-config \
		"$@" "$bin" run --config "$config" --adapter caddyfile >>"$log" 2>&1 &
	caddy_pid=$!
}

# alive PID: the process runs (it is not gone, nor a zombie the script has
# yet to reap).
# Builtins only, so that polling with it forks nothing.
alive() {
	local stat state
	[ -n "$1" ] && { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
	state=${stat##*) }
	state=${state%% *}
	[ -n "$state" ] && [ "$state" != Z ]
}

# wait_until TRIES PAUSE PID COMMAND...: runs COMMAND (its stderr dropped)
# every PAUSE seconds until it succeeds (status 0), at most TRIES times, and
# stops early when the process PID is gone (an empty PID: no such check);
# status 1 when COMMAND never succeeded.
wait_until() {
	local tries=$1 pause=$2 pid=$3
	shift 3
	for _ in $(seq "$tries"); do
		if "$@" 2>/dev/null; then
			return 0
		fi
		if [ -n "$pid" ] && ! alive "$pid"; then
			return 1
		fi
		sleep "$pause"
	done
	return 1
}

# stop_pids PID...: each process still running killed (SIGTERM) and reaped;
# empty PIDs are skipped.
stop_pids() {
	local pid
	for pid; do
		if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
			kill "$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
		fi
	done
}

# keep_or_remove DIR: DIR removed, or kept and named when KEEP is set.
keep_or_remove() {
	if [ -n "${KEEP:-}" ]; then
		echo "kept $1"
	else
		rm -rf "$1"
	fi
}

# wrk_result FILE: the RESULT line of wrk's (or loadgen's) output in FILE;
# status 1, with the output on stderr, when there is none.
wrk_result() {
	grep '^RESULT ' "$1" && return 0
	echo "wrk gave no result:" >&2
	cat "$1" >&2
	return 1
}

# stored ADMIN...: the pingbacks the Caddy instances on these admin
# addresses have stored (answered 200), from their /metrics.
stored() {
	local admin
	for admin; do curl -fsS "http://$admin/metrics"; done |
		awk '/^caddy_pingback_callbacks_total\{/ && /result="stored"/ { s += $NF } END { printf "%d", s }'
}

# median COLUMN [FILE]: the median of a column of numbers (FILE, or stdin).
median() {
	sort -g -k"$1","$1" ${2:+"$2"} | awk -v c="$1" '{ v[NR] = $c } END {
		if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# routes_answer PORT ID: the bench Caddy on PORT answers on /bare, and its
# pingback route stores a pingback of task ID.
routes_answer() {
	curl -fsS -o /dev/null "http://127.0.0.1:$1/bare" &&
		curl -fsS -o /dev/null -d "id=$2&code=ready" "http://127.0.0.1:$1/cb"
}

# admin_answers ADMIN: the admin API on ADMIN answers /pingback/status (the
# app has started and its store is open).
admin_answers() { curl -fsS -o /dev/null "http://$1/pingback/status"; }

# cgroup_setup: sets cgv (the memory cgroup version, 1 or 2) and
# cgroup_parent (where the scripts' cgroups are made: CGROUP_PARENT, or v1
# the script's own memory cgroup, v2 the root, whose memory controller it
# hands to its children); stops the script when there is no memory
# controller. Run as root.
cgroup_setup() {
	if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
		cgv=2
		# v2 allows no processes in a cgroup that hands controllers to its
		# children, so the default parent is the root, which is exempt.
		cgroup_parent=${CGROUP_PARENT:-/sys/fs/cgroup}
		if ! grep -qw memory "$cgroup_parent/cgroup.subtree_control"; then
			echo "+memory" >"$cgroup_parent/cgroup.subtree_control"
		fi
	elif [ -d /sys/fs/cgroup/memory ]; then
		cgv=1
		local own
		own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' /proc/self/cgroup)
		cgroup_parent=${CGROUP_PARENT:-/sys/fs/cgroup/memory${own%/}}
	else
		echo "no memory cgroup controller found (neither /sys/fs/cgroup/cgroup.controllers nor /sys/fs/cgroup/memory)" >&2
		exit 1
	fi
}

# cgroup_make DIR [LIMIT]: a new memory cgroup DIR (under cgroup_parent),
# limited to LIMIT MiB of memory and no swap when LIMIT is given. A process
# joins it by writing its PID to DIR/cgroup.procs (launch_caddy with the
# wrapper: bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' DIR).
cgroup_make() {
	local dir=$1 limit=${2:-} bytes
	mkdir "$dir"
	if [ -z "$limit" ]; then
		return 0
	fi
	bytes=$((limit * 1048576))
	if [ "$cgv" = 1 ]; then
		echo "$bytes" >"$dir/memory.limit_in_bytes"
		# With swap, the limit is also on memory+swap.
		if [ -f "$dir/memory.memsw.limit_in_bytes" ]; then
			echo "$bytes" >"$dir/memory.memsw.limit_in_bytes"
		fi
	else
		echo "$bytes" >"$dir/memory.max"
		if [ -f "$dir/memory.swap.max" ]; then
			echo 0 >"$dir/memory.swap.max"
		fi
	fi
}

# cgroup_remove DIR: the cgroup DIR removed once its processes are gone (a
# warning when it cannot be); nothing when DIR is empty or gone.
cgroup_remove() {
	if [ -z "$1" ] || [ ! -d "$1" ]; then
		return 0
	fi
	# A process that has just exited may still be listed for a moment.
	for _ in $(seq 50); do
		rmdir "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "warning: could not remove the cgroup $1" >&2
}
