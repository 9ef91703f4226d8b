#!/usr/bin/env bash
# bench/loop-stalls.sh - where the servers' event loops wait: every stretch
# of at least MS milliseconds that a thread of NAME spent off its CPU, with
# why (asleep in a lock, in a page fault, preempted, idle in epoll_wait) and
# where (kernel and user stacks), traced with bpftrace on sched_switch.
#
#   bench/loop-stalls.sh [-t MS] [-d SECS] [-n NAME] [-o FILE]
#
#   -t MS    the shortest stretch reported, ms (default 5)
#   -d SECS  how long to trace (default 10); the summary follows
#   -n NAME  the threads followed, by name (default kv-rpc-loop: the event
#            loops of every shardkv-server on the machine)
#   -o FILE  also keep every stretch (wall time, thread, ms, state, stacks)
#
# Prints one line per kind of wait: how many, their total and largest ms,
# and the innermost frames of the stack they left the CPU in. Idle waits in
# epoll_wait (no request arrived) are counted apart. User stacks are whole
# only for binaries built with frame pointers (cmake
# -DCMAKE_C_FLAGS=-fno-omit-frame-pointer); otherwise they show the
# innermost function. Needs root and bpftrace (apt-get install bpftrace,
# done here when missing and run as root). Run it beside a load: it traces
# whatever runs on the machine and stops by itself.
set -euo pipefail

ms=5 dur=10 name=kv-rpc-loop out=''
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
die() { echo "loop-stalls: $*" >&2; exit 1; }

while getopts "t:d:n:o:h" o; do
	case "$o" in
	t) ms=$OPTARG ;;
	d) dur=$OPTARG ;;
	n) name=$OPTARG ;;
	o) out=$OPTARG ;;
	*) usage ;;
	esac
done
[[ $ms =~ ^[1-9][0-9]*$ ]] || die "-t wants a positive number of ms"
[[ $dur =~ ^[1-9][0-9]*$ ]] || die "-d wants a positive number of seconds"
[[ $name =~ ^[A-Za-z0-9:._-]{1,15}$ ]] || die "-n wants a thread name (1-15 of A-Z a-z 0-9 : . _ -)"
[ "$(id -u)" -eq 0 ] || die "bpftrace needs root"
if ! command -v bpftrace >/dev/null; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y bpftrace >/dev/null || die "cannot install bpftrace"
fi

raw=$(mktemp /tmp/loop-stalls.XXXXXX)
trap 'rm -f "$raw"' EXIT
prog=$(
	cat <<EOF
tracepoint:sched:sched_switch
{
	if (args->prev_comm == "$name") {
		@out[args->prev_pid] = nsecs;
		@st[args->prev_pid] = args->prev_state;
		@ks[args->prev_pid] = kstack(8);
		@us[args->prev_pid] = ustack(12);
	}
	if (args->next_comm == "$name") {
		\$t = @out[args->next_pid];
		if (\$t != 0 && nsecs - \$t >= $ms * 1000000) {
			printf("STALL %s tid=%d us=%d state=%d\n%s%s\n",
			       strftime("%H:%M:%S.%f", nsecs), args->next_pid,
			       (nsecs - \$t) / 1000, @st[args->next_pid],
			       @ks[args->next_pid], @us[args->next_pid]);
		}
		delete(@out[args->next_pid]);
	}
}
interval:s:$dur { exit(); }
END { clear(@out); clear(@st); clear(@ks); clear(@us); }
EOF
)
echo "loop-stalls: tracing threads named $name for $dur s (stretches of $ms ms or more)" >&2
# bpftrace ends itself after SECS; timeout interrupts it (it then prints
# what it has) should it not, and kills it 5 s later.
rc=0
timeout -k 5 -s INT $((dur + 15)) bpftrace -e "$prog" >"$raw" 2>/dev/null || rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ -s "$raw" ] || die "bpftrace failed (is the kernel's tracing available?)"
[ -z "$out" ] || cp "$raw" "$out"

python3 - "$raw" <<'EOF'
import re, sys
from collections import defaultdict

stalls, cur, blk = [], None, 0
for line in open(sys.argv[1]):
    m = re.match(r'STALL (\S+) tid=(\d+) us=(\d+) state=(\d+)', line)
    if m:
        cur, blk = {'us': int(m[3]), 'state': int(m[4]), 'k': [], 'u': []}, 0
        stalls.append(cur)
    elif cur is not None and not line.strip():
        blk += 1  # a blank line before the kernel stack, between the two, after
    elif cur is not None:
        (cur['k'] if blk <= 1 else cur['u']).append(line.strip())


def why(s):
    k = ' '.join(s['k'])
    if 'do_epoll_wait' in k:
        return 'idle in epoll_wait'
    if 'futex' in k:
        return 'asleep on a lock (futex)'
    if 'page_fault' in k or 'handle_mm_fault' in k:
        return 'in a page fault'
    if s['state'] == 0 or 'irqentry_exit' in k or 'exit_to_user' in k:
        return 'preempted'
    return 'asleep (state %d)' % s['state']


groups = defaultdict(list)
for s in stalls:
    where = ' < '.join(f for f in s['u'] if not f.startswith('0x'))[:160] or '?'
    groups[(why(s), where)].append(s['us'])
idle = [v for (w, _), vs in groups.items() if w == 'idle in epoll_wait' for v in vs]
rows = sorted(((sum(v), w, where, v) for (w, where), v in groups.items()
               if w != 'idle in epoll_wait'), reverse=True)
print(f"{'count':>6} {'total ms':>9} {'max ms':>7}  why / where (innermost first)")
for tot, w, where, v in rows:
    print(f"{len(v):6d} {tot / 1000:9.1f} {max(v) / 1000:7.1f}  {w}: {where}")
print(f"{len(idle):6d} {sum(idle) / 1000:9.1f} {max(idle, default=0) / 1000:7.1f}  idle in epoll_wait (no request)")
EOF
