# Shared by the test-bed scripts (source it, do not run it).
#
# The SSH bed and the multi-node Slurm bed live on one private network: bridge lpbr0 with the
# main namespace on 10.200.0.1 and network namespaces lp-h1..N on 10.200.0.2..N+1, no default
# route, no NAT. Either bed may come up first and go down in any order: each registers itself as
# a user of the network, and the network is removed when its last user leaves.

LP_BRIDGE=lpbr0
LP_SUBNET=10.200.0
LP_REGISTRY=/run/lp-testbed          # one empty file per bed that uses the network
LP_LOCK=/run/lock/lp-testbed.lock    # serialises changes to the network, the registry and /etc/hosts
LP_TAG='# lp-testbed'                # marks every line we add to a system file

# Where a bed keeps its state (keys, configs, logs, pid files); removed by its `down`.
lp_state_dir() { echo "${LP_TESTBED_TMPDIR:-${TMPDIR:-/tmp}}/lp-testbed-$1"; }

lp_die() { echo "$(basename "$0"): $*" >&2; exit 1; }

lp_require_root() { [ "$(id -u)" = 0 ] || lp_die "must run as root (it creates network namespaces and daemons)"; }

lp_require_commands() {
  local cmd
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null ||
      lp_die "'$cmd' not found; install the test-bed packages with tests/testbeds/install_packages.sh (as root)"
  done
}

# Makes sure no other process uses bed NAME while this script changes it. The Python API holds
# the bed for its whole life and says so with LP_TESTBED_LOCKED=NAME; a script run by hand takes
# the lock for its own run and refuses to touch a bed that a test session holds. Daemons must
# not inherit the lock (fd 8): start them with `8>&-`.
lp_hold_bed() {
  local lock=/run/lock/lp-testbed-$1.lock
  [ "${LP_TESTBED_LOCKED:-}" = "$1" ] && return
  exec 8<>"$lock"
  flock -n 8 || lp_die "the $1 test bed is in use by process $(cat "$lock") ($(tr '\0' ' ' </proc/"$(cat "$lock")"/cmdline 2>/dev/null)); try again when it is done"
  echo $$ >"$lock"
}

# Runs "$@" (a function of this file or the caller) while holding the network lock.
lp_locked() {
  (
    flock -w 60 9 || lp_die "timed out after 60 s waiting for $LP_LOCK"
    "$@"
  ) 9>"$LP_LOCK"
}

lp_namespaces() { ip netns list | awk '/^lp-h[0-9]+( |$)/ {print $1}' | sort -V; }

lp_host_ip() { echo "$LP_SUBNET.$(($1 + 1))"; }

lp_check_host_count() {
  [[ $1 =~ ^[1-9][0-9]*$ ]] && [ "$1" -le 250 ] || lp_die "the number of hosts must be 1..250, not '$1'"
}

# Rewrites our lines in /etc/hosts and each namespace's own hosts file (which `ip netns exec`
# binds over /etc/hosts) so that every lp-hI name resolves everywhere.
_lp_write_names() {
  local names="" ns i kept
  for ns in $(lp_namespaces); do
    i=${ns#lp-h}
    names+="$(lp_host_ip "$i") $ns"$'\n'
  done
  kept=$(grep -v -- "$LP_TAG\$" /etc/hosts || true)
  # Rewrite in place (not sed -i): /etc/hosts may be a bind mount that cannot be replaced.
  {
    [ -n "$kept" ] && printf '%s\n' "$kept"
    printf '%s' "$names" | sed "/^\$/d; s/\$/ $LP_TAG/"
  } >/etc/hosts
  for ns in $(lp_namespaces); do
    mkdir -p "/etc/netns/$ns"
    printf '127.0.0.1 localhost\n%s' "$names" >"/etc/netns/$ns/hosts"
    # DNS stays inside the namespace: nothing outside 10.200.0.0/24 is reachable from it anyway.
    echo "nameserver 127.0.0.1" >"/etc/netns/$ns/resolv.conf"
  done
}

_lp_net_up() {  # N: make sure the bridge and namespaces lp-h1..N exist
  local n=$1 i ns
  if ! ip link show "$LP_BRIDGE" >/dev/null 2>&1; then
    ip link add "$LP_BRIDGE" type bridge
    ip addr add "$LP_SUBNET.1/24" dev "$LP_BRIDGE"
    ip link set "$LP_BRIDGE" up
  fi
  for i in $(seq 1 "$n"); do
    ns=lp-h$i
    [ -e "/run/netns/$ns" ] && continue
    ip netns add "$ns"
    # A veth the kernel has not yet finished removing after an earlier `down` (seen once right
    # after one as "RTNETLINK answers: File exists") would refuse the name.
    ip link del "lpv$i" 2>/dev/null || true
    ip link add "lpv$i" type veth peer name eth0 netns "$ns"
    ip link set "lpv$i" master "$LP_BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(lp_host_ip "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    # Deliberately no default route: a namespace can reach only 10.200.0.0/24.
  done
  _lp_write_names
}

_lp_net_down() {  # removes everything _lp_net_up made, including any process left inside
  local ns pids
  for ns in $(lp_namespaces); do
    pids=$(ip netns pids "$ns")
    if [ -n "$pids" ]; then
      kill -TERM $pids 2>/dev/null || true
      sleep 0.2
      pids=$(ip netns pids "$ns")
      [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    fi
    ip netns del "$ns"
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true
  ip link del "$LP_BRIDGE" 2>/dev/null || true
  _lp_write_names
  # The kernel removes the veth ends asynchronously, once the namespaces' last processes have
  # exited (slow on a loaded machine); wait so that a new `up` can reuse the names.
  local _
  for _ in $(seq 1 300); do
    ip -o link show | grep -q ' lpv[0-9]*@' || return 0
    sleep 0.1
  done
  lp_die "veth links lpv* still present 30 s after removing the namespaces"
}

_lp_net_acquire() {  # BED N
  mkdir -p "$LP_REGISTRY/net"
  # Network present but nobody registered: left over by a crash; start clean.
  if [ -z "$(ls -A "$LP_REGISTRY/net")" ]; then _lp_net_down; fi
  _lp_net_up "$2"
  touch "$LP_REGISTRY/net/$1"
}

_lp_net_release() {  # BED
  rm -f "$LP_REGISTRY/net/$1"
  if [ -z "$(ls -A "$LP_REGISTRY/net" 2>/dev/null)" ]; then
    _lp_net_down
    rm -rf "$LP_REGISTRY"
  fi
}

lp_net_acquire() { lp_locked _lp_net_acquire "$@"; }
lp_net_release() { lp_locked _lp_net_release "$@"; }

# System config files the beds must write (e.g. /etc/slurm/slurm.conf): ours carry LP_TAG on
# the first line; a file that was there before is kept aside and put back by lp_conf_restore.
lp_conf_install() {  # PATH < content
  local path=$1
  mkdir -p "$(dirname "$path")"
  if [ -e "$path" ] && ! head -n1 "$path" | grep -q -- "$LP_TAG"; then
    mv "$path" "$path.lp-testbed-orig"
  fi
  { echo "$LP_TAG: written by the launchpad test beds, removed by their 'down'"; cat; } >"$path"
}

lp_conf_restore() {  # PATH
  local path=$1
  if [ -e "$path" ] && head -n1 "$path" | grep -q -- "$LP_TAG"; then rm -f "$path"; fi
  if [ -e "$path.lp-testbed-orig" ]; then mv "$path.lp-testbed-orig" "$path"; fi
}

# Processes that share the UTS namespace of process PID (each daemon of a bed gets its own, so
# this finds everything it started, including sessions and job steps that left its process tree).
lp_uts_members() {
  local target
  target=$(readlink "/proc/$1/ns/uts" 2>/dev/null) || return 0   # e.g. uts:[4026532301]
  target=${target//[/\\[}
  target=${target//]/\\]}
  find /proc/[0-9]*/ns/uts -maxdepth 0 -lname "$target" 2>/dev/null | cut -d/ -f3 || true
}

# True while PID runs (a zombie waiting to be reaped by init counts as gone).
lp_alive() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $state != Z* ]]
}

# Sends TERM to PIDS, waits up to 3 s, then KILLs what is left.
lp_kill_wait() {
  local pids="$*" _ p alive
  [ -n "$pids" ] || return 0
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 1 30); do
    alive=""
    for p in $pids; do lp_alive "$p" && alive+=" $p"; done
    [ -z "$alive" ] && return 0
    sleep 0.1
  done
  kill -KILL $alive 2>/dev/null || true
}
