#!/usr/bin/env bash
# SSH test bed: N "hosts" lp-h1..N, each a network namespace (10.200.0.2..N+1 on bridge lpbr0)
# with its own hostname and its own sshd accepting key login for root.
#
#   ssh_hosts.sh up [N]    (default 3; re-running replaces a previous bed)
#   ssh_hosts.sh down
#
# Afterwards `ssh lp-h1 hostname` works from the main namespace (a marked block in ~/.ssh/config),
# as does `ssh -F $STATE/ssh_config lp-h1 ...` without that block. Only network and hostname are
# isolated: the filesystem, users and Python are shared. The sshd configuration keeps Debian's
# defaults that matter to a launcher (AcceptEnv LANG LC_*, MaxSessions 10, MaxStartups 10:30:100),
# so what works here works against a stock server.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

STATE=$(lp_state_dir ssh)
lp_hold_bed ssh
SSH_CONFIG=${LP_SSH_USER_CONFIG:-$HOME/.ssh/config}
BEGIN="# lp-testbed ssh begin"
END="# lp-testbed ssh end"

down() {
  local pidf pid
  for pidf in "$STATE"/sshd-*.pid; do
    [ -f "$pidf" ] || continue
    pid=$(cat "$pidf")
    # The listener, its sessions and whatever they started, even if daemonised.
    lp_alive "$pid" && lp_kill_wait $(lp_uts_members "$pid")
  done
  if [ -f "$SSH_CONFIG" ]; then
    sed -i "/^$BEGIN\$/,/^$END\$/d" "$SSH_CONFIG"
    [ -s "$SSH_CONFIG" ] || rm -f "$SSH_CONFIG"
  fi
  if [ -e "$LP_REGISTRY/net/ssh" ] || [ -d "$STATE" ]; then lp_net_release ssh; fi
  rm -rf "$STATE"
}

client_options() {  # the options every client needs, in ssh_config syntax
  cat <<EOF
  User root
  IdentityFile $STATE/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  ConnectTimeout 5
EOF
}

wait_for_login() {  # I
  local ip _
  ip=$(lp_host_ip "$1")
  for _ in $(seq 1 50); do
    ssh -F "$STATE/ssh_config" "$ip" true 2>/dev/null && return
    sleep 0.1
  done
  lp_die "sshd on lp-h$1 ($ip) does not accept our key; log: $(cat "$STATE/sshd-$1.log" 2>/dev/null)"
}

up() {
  local n=$1 i ns ip pid waiting=()
  lp_check_host_count "$n"
  lp_require_root
  lp_require_commands ip flock nsenter unshare ssh ssh-keygen /usr/sbin/sshd
  down
  mkdir -p "$STATE" /run/sshd
  chmod 700 "$STATE"
  ssh-keygen -q -t ed25519 -N '' -C lp-testbed-client -f "$STATE/id_ed25519"
  ssh-keygen -q -t ed25519 -N '' -C lp-testbed-host -f "$STATE/ssh_host_ed25519_key"
  cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"

  cat >"$STATE/sshd_config" <<EOF
HostKey $STATE/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AuthorizedKeysFile $STATE/authorized_keys
AcceptEnv LANG LC_*
PrintMotd no
Subsystem sftp internal-sftp
LogLevel ERROR
# A client that went away while its host was cut off (its FIN lost) is noticed once the network
# is back, at the next of these probes, and its session ends; a cut shorter than a minute
# (the tests' are) ends no session of a client that is still there.
ClientAliveInterval 5
ClientAliveCountMax 12
EOF
  { echo "Host $LP_SUBNET.* lp-h*"; client_options; } >"$STATE/ssh_config"

  lp_net_acquire ssh "$n"
  for i in $(seq 1 "$n"); do
    ns=lp-h$i
    ip=$(lp_host_ip "$i")
    # `ip netns exec` binds /etc/netns/$ns/{hosts,resolv.conf} over /etc; `unshare --uts` gives
    # the host its own hostname (and marks everything started from it, see lp_uts_members).
    ip netns exec "$ns" unshare --uts sh -c "hostname $ns && exec /usr/sbin/sshd \
      -f '$STATE/sshd_config' -o ListenAddress=$ip -o PidFile='$STATE/sshd-$i.pid' -E '$STATE/sshd-$i.log'" 8>&-
  done

  mkdir -p "$(dirname "$SSH_CONFIG")"
  chmod 700 "$(dirname "$SSH_CONFIG")"
  { echo "$BEGIN"; echo "Host $LP_SUBNET.* lp-h*"; client_options; echo "$END"; } >>"$SSH_CONFIG"

  # A real login per host, in parallel (each runs the login shell, which may be slow to start).
  for i in $(seq 1 "$n"); do wait_for_login "$i" & waiting+=($!); done
  for pid in "${waiting[@]}"; do wait "$pid"; done
  for i in $(seq 1 "$n"); do echo "lp-h$i $(lp_host_ip "$i")"; done
}

case "${1:-}" in
  up) up "${2:-3}" ;;
  down) down ;;
  *) echo "usage: $0 up [N] | down" >&2; exit 2 ;;
esac
