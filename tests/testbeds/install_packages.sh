#!/usr/bin/env bash
# Installs the Debian packages the test beds need (run as root): the multi-host beds, the
# dashboard's browser and Graphviz.
# Idempotent and quiet: when every package is already installed it does nothing at all.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

PACKAGES=(
  tmux
  openssh-server openssh-client                                   # ssh_hosts.sh
  slurm-wlm munge                                                 # slurm_cluster.sh
  podman runc catatonit containernetworking-plugins iptables      # podman_image.sh
  chromium                                                        # the dashboard's browser test
  graphviz                                                        # program.draw
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

# apt's chatter (e.g. debconf's "delaying package configuration") is shown only on failure.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "install_packages.sh: could not install: ${missing[*]}" >&2
  exit 1
fi
