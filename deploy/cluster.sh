#!/usr/bin/env bash
# deploy/cluster.sh - a local shardkv cluster on loopback (doc/contract.md §6).
#
#   cluster.sh up [-n NODES] [--controllers C] [--dir DIR] [--base-port PORT]
#                 [--metrics] [--replicas R]
#                      start a controller (C replicas with Raft, e.g. 3 or 5;
#                      default 1) and NODES servers (default 3), join them,
#                      wait until they serve, print the controller address(es);
#                      --metrics: every daemon also serves /metrics and
#                      /healthz on a port of its own (printed, and listed for
#                      Prometheus in DIR/prometheus-targets.json);
#                      --replicas R: each range is kept on R nodes (the
#                      controller's --replicas; default the controller's, 3;
#                      --replicas 1: one copy per range, no failover)
#   cluster.sh status  the cluster's status (shardkv status)
#   (--dir DIR may be given with any command)
#   cluster.sh add [--no-wait]  start and join one more server (--no-wait:
#                      return once it runs, while its data may still move)
#   cluster.sh stop N  stop server N gracefully (SIGTERM: it drains first)
#   cluster.sh kill N  kill server N (SIGKILL)
#   cluster.sh restart N  start server N again with its data dir
#   cluster.sh down    stop everything (servers without draining), keep the data
#   cluster.sh destroy stop everything and remove the data
#   cluster.sh stop-controller K | kill-controller K | restart-controller K
#                      SIGTERM / SIGKILL / start again controller replica K
#                      (1-based; a single controller is replica 1)
#   cluster.sh metrics the metrics endpoints (clusters started with --metrics)
#   cluster.sh --help  this text
#
# A server that exits while cluster.sh waits for it is reported with its exit
# status and the reason from its log; exit 4 means its node is gone from the
# cluster (removed, or left with `shardkv leave`): its data dir cannot come
# back, and `cluster.sh add` starts a new node instead.
#
# The controller listens on tcp://127.0.0.1:PORT (default 7000), server N on
# PORT+100+N. With --controllers C, replica K listens on PORT+K-1 and its Raft
# transport on PORT+K-1+1000; servers and the CLI get the comma-separated
# list of all C addresses. With --metrics, controller replica K serves
# metrics on 127.0.0.1:PORT+300+K-1 and server N on 127.0.0.1:PORT+400+N.
# State lives in DIR (default ./cluster, or $SHARDKV_CLUSTER_DIR):
# one data dir, log file and pid file per process. Binaries come from
# $SHARDKV_BIN_DIR, else build-release/bin or build/bin (built when missing).
# With $SHARDKV_AUTH_TOKEN_FILE set at `up`, the controller and every server
# run with --auth-token-file FILE (the path is kept in DIR/cluster.env for the
# later commands), and so does the CLI, which reads the same variable.
# With $SHARDKV_TLS_CERT, $SHARDKV_TLS_KEY and $SHARDKV_TLS_CA set at `up`
# (PEM files; all three), every address is tls+tcp:// and the controller and
# every server run with --tls-cert/--tls-key/--tls-ca; the CLI reads the same
# variables, so it shows the same certificate (kept in DIR/cluster.env too).
# TLS covers the controllers' client-facing listeners only: the replicas'
# Raft transport (PORT+K-1+1000) stays plain TCP on loopback.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
# proc_start, proc_alive, proc_wait_ready, proc_stop (shared with bench/lib.sh)
# shellcheck source=deploy/proc.sh
. "$here/deploy/proc.sh"
dir=${SHARDKV_CLUSTER_DIR:-$PWD/cluster}
base=7000
auth=
tls_cert=
tls_key=
tls_ca=
scheme=tcp
nodes=3
nctl=1
metrics=0
replicas=""
wait_s=${SHARDKV_WAIT_S:-30}

die() { echo "cluster.sh: $*" >&2; exit 1; }
# usage [CODE]: the header above; on stdout and exit 0 for --help, on stderr
# and exit 2 after a usage error.
usage() {
	local code=${1:-2}
	if [ "$code" -eq 0 ]; then
		awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
	else
		awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
	fi
	exit "$code"
}

find_bins() {
	if [ -n "${SHARDKV_BIN_DIR:-}" ]; then
		bin=$SHARDKV_BIN_DIR
	elif [ -x "$here/build-release/bin/shardkv-server" ]; then
		bin=$here/build-release/bin
	elif [ -x "$here/build/bin/shardkv-server" ]; then
		bin=$here/build/bin
	else
		echo "cluster.sh: building shardkv (Release)" >&2
		bash "$here/scripts/setup.sh"
		cmake -S "$here" -B "$here/build-release" -DCMAKE_BUILD_TYPE=Release \
			-DKV_BUILD_TESTS=OFF >/dev/null
		cmake --build "$here/build-release" -j"$(nproc)" >/dev/null
		bin=$here/build-release/bin
	fi
	for b in shardkv-controller shardkv-server shardkv; do
		[ -x "$bin/$b" ] || die "$bin/$b is missing"
	done
}

load_state() {
	[ -f "$dir/cluster.env" ] || die "no cluster in $dir (run: cluster.sh up)"
	# shellcheck disable=SC1091
	. "$dir/cluster.env"
	use_auth
	use_tls
	ctl_list
}

save_state() {
	mkdir -p "$dir"
	printf 'base=%s\nbin=%s\nauth=%q\ntls_cert=%q\ntls_key=%q\ntls_ca=%q\nnctl=%s\nmetrics=%s\nreplicas=%s\n' \
		"$base" "$bin" "$auth" "$tls_cert" "$tls_key" "$tls_ca" "$nctl" "$metrics" "$replicas" \
		>"$dir/cluster.env"
}

# The metrics port of controller replica $1, and of server $1.
ctl_mport() { echo $((base + 300 + $1 - 1)); }
srv_mport() { echo $((base + 400 + $1)); }

# metrics_args KIND N: the --metrics flag of a daemon, when the cluster has
# metrics (sets the array metrics_flag).
metrics_flag=()
metrics_args() {
	metrics_flag=()
	[ "${metrics:-0}" = 1 ] || return 0
	if [ "$1" = ctl ]; then
		metrics_flag=(--metrics "127.0.0.1:$(ctl_mport "$2")")
	else
		metrics_flag=(--metrics "127.0.0.1:$(srv_mport "$2")")
	fi
}

# Writes DIR/prometheus-targets.json (Prometheus file_sd_configs: one target
# group per job) and prints the endpoints on stderr.
write_targets() {
	[ "${metrics:-0}" = 1 ] || return 0
	local k n first=1 out="$dir/prometheus-targets.json"
	{
		printf '[\n  {"labels": {"job": "shardkv-controller"}, "targets": ['
		for ((k = 1; k <= ${nctl:-1}; k++)); do
			[ $k -gt 1 ] && printf ', '
			printf '"127.0.0.1:%s"' "$(ctl_mport $k)"
		done
		printf ']},\n  {"labels": {"job": "shardkv-server"}, "targets": ['
		for n in $(server_numbers); do
			[ $first = 1 ] || printf ', '
			first=0
			printf '"127.0.0.1:%s"' "$(srv_mport "$n")"
		done
		printf ']}\n]\n'
	} >"$out.tmp"
	mv "$out.tmp" "$out"
}

# The numbers of the servers that have a data dir, in order.
server_numbers() {
	local d
	for d in "$dir"/node-*/; do
		[ -d "$d" ] || continue
		d=${d%/}
		echo "${d##*/node-}"
	done | sort -n
}

# Prints every metrics endpoint (cluster.sh metrics).
print_metrics() {
	local k n
	[ "${metrics:-0}" = 1 ] || die "the cluster in $dir runs without metrics (cluster.sh up --metrics)"
	for ((k = 1; k <= ${nctl:-1}; k++)); do
		echo "controller $k: http://127.0.0.1:$(ctl_mport $k)/metrics"
	done
	for n in $(server_numbers); do
		echo "node $n: http://127.0.0.1:$(srv_mport "$n")/metrics"
	done
	echo "prometheus targets: $dir/prometheus-targets.json"
}

# ctl: the controller address, or the comma-separated replica addresses
# (after use_tls, which sets the scheme).
ctl_list() {
	local k
	ctl="$scheme://127.0.0.1:$base"
	for ((k = 2; k <= ${nctl:-1}; k++)); do ctl="$ctl,$scheme://127.0.0.1:$((base + k - 1))"; done
}

# The pid file of controller replica $1 (controller.pid when standalone).
ctl_pidf() { if [ "${nctl:-1}" -eq 1 ]; then echo "$dir/controller.pid"; else echo "$dir/controller-$1.pid"; fi; }

# The pids of the controller replicas that have a pid file.
ctl_pids() {
	local k f
	for ((k = 1; k <= ${nctl:-1}; k++)); do
		f=$(ctl_pidf $k)
		[ -f "$f" ] && cat "$f"
	done
	true
}

# The shared secret, when the cluster has one: the daemons' flag, and the
# variable the CLI reads.
auth_args=()
use_auth() {
	auth_args=()
	if [ -n "${auth:-}" ]; then
		[ -r "$auth" ] || die "cannot read the auth token file $auth"
		auth_args=(--auth-token-file "$auth")
		export SHARDKV_AUTH_TOKEN_FILE=$auth
	fi
}

# TLS, when the cluster has it: the daemons' flags, the URL scheme, and the
# variables the CLI reads (cleared for a plain cluster, where they would be
# refused with tcp:// addresses).
tls_args=()
use_tls() {
	tls_args=()
	scheme=tcp
	if [ -n "${tls_ca:-}" ]; then
		for f in "$tls_cert" "$tls_key" "$tls_ca"; do
			[ -r "$f" ] || die "cannot read the TLS file $f"
		done
		tls_args=(--tls-cert "$tls_cert" --tls-key "$tls_key" --tls-ca "$tls_ca")
		scheme=tls+tcp
		export SHARDKV_TLS_CERT=$tls_cert SHARDKV_TLS_KEY=$tls_key SHARDKV_TLS_CA=$tls_ca
	else
		unset SHARDKV_TLS_CERT SHARDKV_TLS_KEY SHARDKV_TLS_CA
	fi
}

abspath() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }

alive() { [ -f "$1" ] && proc_alive "$(cat "$1")"; }

# A dead replica costs the client up to a second before it tries the next
# one, so the timeout grows with the number of controllers.
cli() {
	local t=2000
	[ "${nctl:-1}" -gt 1 ] && t=$((1000 * nctl + 3000))
	"$bin/shardkv" -c "$ctl" --timeout "$t" "$@"
}

# Polls until the controller answers (replicated: until one leads), or fails
# after the deadline.
wait_controller() {
	local what=config rv=0
	[ "${nctl:-1}" -gt 1 ] && what=status
	proc_wait_ready "$wait_s" "$(ctl_pids)" cli $what || rv=$?
	[ $rv -ne 2 ] || die "controller exited; see $dir/controller*.log"
	[ $rv -eq 0 ] || die "controller not ready after ${wait_s}s"
}

# Whether the server at $1 is an active node of the configuration.
server_active() {
	cli config --json 2>/dev/null | tr '{' '\n' | grep -F "\"address\": \"$1\"" |
		grep -q '"state": "active"'
}

# Whether the controller knows the server at $1 (registered, in any state).
server_registered() { cli config --json 2>/dev/null | grep -qF "\"address\": \"$1\""; }

# Polls until the server at $1 (pid file $2) passes the check $3 (default
# server_active), or dies after the deadline or when it exits.
wait_server() {
	local addr=$1 pidf=$2 check=${3:-server_active} rv=0
	proc_wait_ready "$wait_s" "$(cat "$pidf")" "$check" "$addr" || rv=$?
	[ $rv -ne 2 ] || server_exited "$addr" "$pidf"
	[ $rv -eq 0 ] || die "server $addr not ready ($check) after ${wait_s}s"
}

# Reports a server that exited while we waited for it (pid file $2): its
# exit status (it is a child of this shell) and the reason its log gives,
# then fails.
server_exited() {
	local addr=$1 pidf=$2 pid code=0 log why
	pid=$(cat "$pidf")
	log=${pidf%.pid}.log
	wait "$pid" 2>/dev/null || code=$?
	rm -f "$pidf"
	if [ "$code" -eq 4 ]; then
		why=$(grep -a 'node is gone from the cluster' "$log" | tail -n 1 || true)
		echo "cluster.sh: server $addr exited 4: its node is gone from the cluster" \
			"(removed, or left with shardkv leave); its data dir cannot rejoin." \
			"Start a new node with: cluster.sh add" >&2
		[ -z "$why" ] || echo "cluster.sh: $log: $why" >&2
		exit 4
	fi
	why=$(grep -aE ' (error|warn) ' "$log" | tail -n 1 || true)
	[ -n "$why" ] || why=$(tail -n 1 "$log" 2>/dev/null || true)
	die "server $addr exited (status $code); see $log${why:+: $why}"
}

start_controller() {
	if [ "${nctl:-1}" -eq 1 ]; then
		mkdir -p "$dir/controller"
		alive "$dir/controller.pid" && return 0
		metrics_args ctl 1
		proc_start "$dir/controller.log" "$bin/shardkv-controller" --listen "$ctl" \
			--data-dir "$dir/controller" ${metrics_flag[@]+"${metrics_flag[@]}"} \
			${replicas:+--replicas "$replicas"} \
			${auth_args[@]+"${auth_args[@]}"} ${tls_args[@]+"${tls_args[@]}"}
		echo "$proc_pid" >"$dir/controller.pid"
	else
		local k
		for ((k = 1; k <= nctl; k++)); do start_replica "$k"; done
	fi
	wait_controller
}

# Starts controller replica $1 of a replicated control plane (no wait).
start_replica() {
	local k=$1 pidf
	pidf=$(ctl_pidf "$k")
	alive "$pidf" && return 0
	mkdir -p "$dir/controller-$k"
	metrics_args ctl "$k"
	proc_start "$dir/controller-$k.log" "$bin/shardkv-controller" --id "$k" --peers "$ctl" \
		--listen "$scheme://127.0.0.1:$((base + k - 1))" --data-dir "$dir/controller-$k" \
		${metrics_flag[@]+"${metrics_flag[@]}"} ${replicas:+--replicas "$replicas"} \
		${auth_args[@]+"${auth_args[@]}"} ${tls_args[@]+"${tls_args[@]}"}
	echo "$proc_pid" >"$pidf"
}

start_server() {
	local n=$1 port=$((base + 100 + $1)) nowait=${2:-}
	local addr="$scheme://127.0.0.1:$port" pidf="$dir/node-$n.pid"
	mkdir -p "$dir/node-$n"
	alive "$pidf" && return 0
	metrics_args srv "$n"
	proc_start "$dir/node-$n.log" "$bin/shardkv-server" --listen "$addr" --controller "$ctl" \
		--data-dir "$dir/node-$n" ${metrics_flag[@]+"${metrics_flag[@]}"} \
		--join ${auth_args[@]+"${auth_args[@]}"} ${tls_args[@]+"${tls_args[@]}"}
	echo "$proc_pid" >"$pidf"
	if [ -n "$nowait" ]; then
		# Running and registered is enough: poll until the controller knows it.
		wait_server "$addr" "$pidf" server_registered
	else
		wait_server "$addr" "$pidf"
	fi
	if [ "${metrics:-0}" = 1 ]; then
		echo "node $n: $addr (pid $(cat "$pidf"), metrics http://127.0.0.1:$(srv_mport "$n")/metrics)" >&2
		write_targets
	else
		echo "node $n: $addr (pid $(cat "$pidf"))" >&2
	fi
}

# Stops the process of pid file $1 with signal $2 (SIGKILL after 90 s: a
# draining server may take that long).
stop_pid() {
	local pidf=$1 sig=$2
	if alive "$pidf"; then proc_stop "$sig" 90 "$(cat "$pidf")" || true; fi
	rm -f "$pidf"
}

server_count() {
	local n=0
	for d in "$dir"/node-*/; do [ -d "$d" ] && n=$((n + 1)); done
	echo $n
}

# --dir DIR may come anywhere; the rest is the command and its arguments.
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	--dir) dir=${2:?--dir needs a path}; shift 2 ;;
	--dir=*) dir=${1#--dir=}; shift ;;
	*) args+=("$1"); shift ;;
	esac
done
set -- "${args[@]+"${args[@]}"}"
cmd=${1:-}
[ -n "$cmd" ] || usage
shift
case "$cmd" in
up)
	while [ $# -gt 0 ]; do
		case "$1" in
		-n) nodes=${2:?-n needs a number}; shift 2 ;;
		--base-port) base=${2:?--base-port needs a port}; shift 2 ;;
		--controllers) nctl=${2:?--controllers needs a number}; shift 2 ;;
		--metrics) metrics=1; shift ;;
		--replicas) replicas=${2:?--replicas needs a number}; shift 2 ;;
		*) echo "cluster.sh: unknown option $1" >&2; usage ;;
		esac
	done
	[[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] || die "-n wants a positive number"
	[[ $base =~ ^[0-9]+$ ]] && [ "$base" -ge 1 ] && [ "$base" -le 64000 ] ||
		die "--base-port wants a port number (at most 64000)"
	[[ $nctl =~ ^[0-9]+$ ]] && [ "$nctl" -ge 1 ] && [ "$nctl" -le 9 ] ||
		die "--controllers wants 1 to 9 (3 or 5 for a replicated control plane)"
	[ -z "$replicas" ] || { [[ $replicas =~ ^[1-5]$ ]] || die "--replicas wants 1 to 5"; }
	find_bins
	dir=$(mkdir -p "$dir" && cd "$dir" && pwd)
	auth=${SHARDKV_AUTH_TOKEN_FILE:-}
	if [ -n "$auth" ]; then
		[ -r "$auth" ] || die "cannot read \$SHARDKV_AUTH_TOKEN_FILE $auth"
		auth=$(cd "$(dirname "$auth")" && pwd)/$(basename "$auth")
	fi
	use_auth
	tls_cert=${SHARDKV_TLS_CERT:-} tls_key=${SHARDKV_TLS_KEY:-} tls_ca=${SHARDKV_TLS_CA:-}
	if [ -n "$tls_cert$tls_key$tls_ca" ]; then
		[ -n "$tls_cert" ] && [ -n "$tls_key" ] && [ -n "$tls_ca" ] ||
			die "TLS needs all of \$SHARDKV_TLS_CERT, \$SHARDKV_TLS_KEY and \$SHARDKV_TLS_CA"
		for f in "$tls_cert" "$tls_key" "$tls_ca"; do
			[ -r "$f" ] || die "cannot read the TLS file $f"
		done
		tls_cert=$(abspath "$tls_cert") tls_key=$(abspath "$tls_key") tls_ca=$(abspath "$tls_ca")
	fi
	use_tls
	save_state
	ctl_list
	start_controller
	if [ "$metrics" = 1 ]; then
		for ((k = 1; k <= nctl; k++)); do
			echo "controller $k: metrics http://127.0.0.1:$(ctl_mport $k)/metrics" >&2
		done
	fi
	for ((i = 1; i <= nodes; i++)); do start_server "$i"; done
	write_targets
	echo "$ctl"
	;;
metrics)
	load_state
	print_metrics
	;;
status)
	load_state
	cli status "$@"
	;;
add)
	load_state
	case "${1:-}" in
	"") start_server $(($(server_count) + 1)) ;;
	--no-wait) start_server $(($(server_count) + 1)) nowait ;;
	*) die "add takes only --no-wait" ;;
	esac
	;;
stop | kill | restart)
	n=${1:-}
	[[ $n =~ ^[0-9]+$ ]] || die "$cmd wants a server number"
	load_state
	[ -d "$dir/node-$n" ] || die "no server $n in $dir"
	case "$cmd" in
	stop) stop_pid "$dir/node-$n.pid" TERM ;;
	kill) stop_pid "$dir/node-$n.pid" KILL ;;
	restart)
		stop_pid "$dir/node-$n.pid" INT
		start_server "$n"
		;;
	esac
	;;
down | destroy)
	[ "$cmd" = destroy ] && [ ! -f "$dir/cluster.env" ] && { rm -rf "$dir"; exit 0; }
	load_state
	for p in "$dir"/node-*.pid; do [ -f "$p" ] && stop_pid "$p" INT; done
	for ((k = 1; k <= nctl; k++)); do stop_pid "$(ctl_pidf $k)" TERM; done
	[ "$cmd" = destroy ] && rm -rf "$dir"
	true
	;;
stop-controller | kill-controller | restart-controller)
	k=${1:-}
	[[ $k =~ ^[0-9]+$ ]] || die "$cmd wants a controller replica number"
	load_state
	[ "$k" -ge 1 ] && [ "$k" -le "$nctl" ] || die "no controller replica $k (1..$nctl)"
	case "$cmd" in
	stop-controller) stop_pid "$(ctl_pidf "$k")" TERM ;;
	kill-controller) stop_pid "$(ctl_pidf "$k")" KILL ;;
	restart-controller)
		stop_pid "$(ctl_pidf "$k")" TERM
		if [ "$nctl" -eq 1 ]; then start_controller; else start_replica "$k"; wait_controller; fi
		;;
	esac
	;;
-h | --help | help) usage 0 ;;
*) echo "cluster.sh: unknown command $cmd" >&2; usage ;;
esac
