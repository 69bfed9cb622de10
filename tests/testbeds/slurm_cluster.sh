#!/usr/bin/env bash
# Slurm test bed: a real Slurm cluster (Debian's slurm-wlm, no systemd, no cgroups) on this machine.
#
#   slurm_cluster.sh single     one node named "$(hostname -s)" on 127.0.0.1
#   slurm_cluster.sh multi [N]  nodes lp-h1..N (default 3), one slurmd per network namespace of
#                               the shared test-bed network; slurmctld on 10.200.0.1
#   slurm_cluster.sh down
#
# Bringing a cluster up replaces the previous one. Plain `srun`, `sbatch`, `squeue`, `scancel` work
# afterwards (the bed writes /etc/slurm/slurm.conf and restores what was there on `down`).
# Heterogeneous jobs need one node per component: use `multi`. There is no accounting (no sacct).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STATE=$(lp_state_dir slurm)
lp_hold_bed slurm
CONF=/etc/slurm/slurm.conf
CPUS=${LP_SLURM_CPUS:-4}   # advertised per node; may exceed the real cores (config_overrides)
HOST=$(hostname -s)

down() {
  local pidf pid steps=""
  if [ -f "$CONF" ] && head -n1 "$CONF" | grep -q -- "$LP_TAG" && [ -f "$STATE/ctld/slurmctld.pid" ]; then
    timeout 5 scancel --quiet --full --signal=KILL $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true
  fi
  for pidf in "$STATE"/slurmd-*.pid; do
    [ -f "$pidf" ] || continue
    pid=$(cat "$pidf")
    # slurmd, its slurmstepds and every task they started (see lp_uts_members).
    lp_alive "$pid" && steps+=" $(lp_uts_members "$pid" | tr '\n' ' ')"
  done
  [ -f "$STATE/ctld/slurmctld.pid" ] && steps+=" $(cat "$STATE/ctld/slurmctld.pid")"
  lp_kill_wait $steps
  if [ -f "$STATE/munge/munged.pid" ]; then lp_kill_wait "$(cat "$STATE/munge/munged.pid")"; fi
  lp_conf_restore "$CONF"
  if [ -e "$LP_REGISTRY/net/slurm" ]; then lp_net_release slurm; fi
  rm -rf "$STATE"
}

start_munge() {
  # A munged that already runs (a real system's) is used as is; otherwise we run our own.
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  install -d -o munge -g munge -m 0755 /run/munge
  [ -s /etc/munge/munge.key ] || lp_die "/etc/munge/munge.key is missing (reinstall the munge package)"
  # munged insists that its log and pid files live in a directory only it (or root) can write.
  install -d -o munge -g munge -m 0700 "$STATE/munge"
  runuser -u munge -- /usr/sbin/munged --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" 8>&-
  munge -n | unmunge >/dev/null || lp_die "munged does not answer; log: $(cat "$STATE/munge/munged.log")"
}

write_conf() {  # CONTROLLER_ADDRESS NODE_LINE...
  local ctl=$1
  shift
  lp_conf_install "$CONF" <<EOF
ClusterName=lptestbed
SlurmctldHost=$HOST($ctl)
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
# Backfill is what starts heterogeneous jobs; its default interval is 30 s.
SchedulerParameters=bf_interval=1
ReturnToService=2
StateSaveLocation=$STATE/ctld/state
SlurmdSpoolDir=$STATE/spool-%n
SlurmctldPidFile=$STATE/ctld/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/ctld/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=5
$(printf '%s\n' "$@")
EOF
}

wait_idle() {  # NODE_COUNT
  local _
  for _ in $(seq 1 60); do
    [ "$(sinfo -h -o '%t %D' 2>/dev/null)" = "idle $1" ] && { sinfo -N -h -o '%N %t'; return; }
    sleep 0.25
  done
  lp_die "nodes not idle after 15 s: $(sinfo -N 2>&1); see logs in $STATE"
}

setup() {
  lp_require_root
  lp_require_commands flock unshare nsenter munge unmunge /usr/sbin/munged /usr/sbin/slurmctld \
    /usr/sbin/slurmd srun sinfo squeue scancel
  down
  install -d -m 0755 "$STATE"
  install -d -o slurm -g slurm "$STATE/ctld" "$STATE/ctld/state"   # slurmctld runs as user slurm
  start_munge
}

case "${1:-}" in
  single)
    setup
    write_conf 127.0.0.1 \
      "NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=4000 State=UNKNOWN" \
      "PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP"
    /usr/sbin/slurmctld 8>&-
    # Own UTS namespace (same hostname): marks every step it starts, for `down`.
    unshare --uts /usr/sbin/slurmd 8>&-
    wait_idle 1 ;;
  multi)
    N=${2:-3}
    lp_check_host_count "$N"
    setup
    lp_net_acquire slurm "$N"
    lines=()
    for i in $(seq 1 "$N"); do
      lines+=("NodeName=lp-h$i NodeAddr=$(lp_host_ip "$i") CPUs=$CPUS RealMemory=4000 State=UNKNOWN")
    done
    lines+=("PartitionName=debug Nodes=lp-h[1-$N] Default=YES MaxTime=INFINITE State=UP")
    write_conf "$LP_SUBNET.1" "${lines[@]}"
    /usr/sbin/slurmctld 8>&-
    for i in $(seq 1 "$N"); do
      # nsenter, not `ip netns exec`: the latter remounts /sys and slurmd then fails with
      # "No filesystem mounted on /sys/fs/cgroup / Unable to initialize cgroup plugin".
      nsenter --net="/run/netns/lp-h$i" unshare --uts sh -c "hostname lp-h$i && exec /usr/sbin/slurmd -N lp-h$i" 8>&-
    done
    wait_idle "$N" ;;
  down) down ;;
  *) echo "usage: $0 single | multi [N] | down" >&2; exit 2 ;;
esac
