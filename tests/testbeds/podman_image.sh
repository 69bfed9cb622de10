#!/usr/bin/env bash
# Podman test bed for the Kubernetes launcher: pods run for real with `podman kube play`.
#
#   podman_image.sh up      configure podman, build image localhost/lp-python if missing or
#                           stale, create the internal network lpnet (10.201.0.0/24)
#   podman_image.sh down    remove every pod and container on lpnet or from the image, the
#                           network and our containers.conf; the image stays as a cache
#   podman_image.sh purge   down, then remove the image too
#
# The image is built without any registry: Debian's python3.11 with its standard library and
# shared libraries, copied from this machine, plus launchpad's dependencies and its kubernetes
# extra's in /usr/local/lib/python3.11/dist-packages (see copy_distributions.py: copied from the tests'
# interpreter, $LP_PYTHON, when that is CPython 3.11; fetched as cp311 wheels otherwise).
# launchpad itself is not in the image: mount the source tree with a hostPath volume and put it
# on PYTHONPATH, so code changes need no rebuild. The image is rebuilt when this script,
# copy_distributions.py or a dependency's version changes.
#
# Always pass `--network lpnet` (or `--network none`) to podman: its default network adds NAT
# and turns on net.ipv4.ip_forward. Pods get no DNS names for each other: use `--ip`/hostAliases.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"

IMAGE=localhost/lp-python:latest
NETWORK=lpnet
SUBNET=10.201.0.0/24
PYTHON=${LP_PYTHON:-python3}
PYPROJECT=$HERE/../../pyproject.toml
CONTAINERS_CONF=/etc/containers/containers.conf
lp_hold_bed podman

configure() {
  # crun 1.8 rejects this kind of host's hybrid cgroup layout: use runc. Without
  # CAP_SYS_RESOURCE podman cannot raise nofile to its default 1048576, and it lowers its own
  # nproc limit to 32768: pin the containers' limits at or below both.
  local nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  lp_conf_install "$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
}

image_key() {
  { cat "$HERE/podman_image.sh" "$HERE/copy_distributions.py"
    "$PYTHON" "$HERE/copy_distributions.py" list "$PYPROJECT"
    /usr/bin/python3.11 --version
  } | sha256sum | cut -c1-16
}

build_image() {  # KEY
  local root bins b lib
  root=$(mktemp -d "${TMPDIR:-/tmp}/lp-testbed-rootfs.XXXXXX")
  BUILD_ROOT=$root
  trap 'rm -rf "$BUILD_ROOT"' EXIT
  mkdir -p "$root"/{usr/bin,usr/lib64,etc,tmp,proc,sys,dev,root,run}
  chmod 1777 "$root/tmp"
  ln -s usr/bin "$root/bin"
  ln -s usr/lib "$root/lib"
  ln -s usr/lib64 "$root/lib64"
  ln -s bin "$root/usr/sbin"
  ln -s usr/bin "$root/sbin"
  bins="/usr/bin/python3.11 /usr/bin/dash /usr/bin/cat /usr/bin/ls /usr/bin/sleep /usr/bin/env
        /usr/bin/hostname /usr/bin/echo /usr/bin/true /usr/bin/kill"
  for b in $bins; do cp -aL "$b" "$root/usr/bin/"; done
  ln -s python3.11 "$root/usr/bin/python3"
  ln -s python3.11 "$root/usr/bin/python"
  ln -s dash "$root/usr/bin/sh"
  tar -C / --exclude=__pycache__ --exclude=usr/lib/python3.11/test --exclude=usr/lib/python3.11/idlelib \
    --exclude=usr/lib/python3.11/tkinter --exclude=usr/lib/python3.11/lib2to3 \
    -cf - usr/lib/python3.11 | tar -C "$root" -xf -
  "$PYTHON" "$HERE/copy_distributions.py" copy "$PYPROJECT" "$root/usr/local/lib/python3.11/dist-packages"
  # Shared libraries of the programs and of every extension module, from this machine.
  find "$root" -name '*.so*' -type f -print0 | xargs -0 ldd 2>/dev/null | cat - <(for b in $bins; do ldd "$b"; done) |
    awk '$2 == "=>" && $3 ~ /^\/(usr\/)?lib/ {print $3}' | sort -u | while read -r lib; do
      [ -e "$root$lib" ] || { mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; }
    done
  cp -L /lib64/ld-linux-x86-64.so.2 "$root/usr/lib64/"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
  tar -C "$root" -cf - . | podman import --quiet \
    --change 'CMD ["/usr/bin/python3"]' --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change "LABEL lp.testbed.key=$1" - "$IMAGE" >/dev/null
  rm -rf "$root"
}

# podman's network config chains the CNI plugins portmap (hostPort NAT) and firewall (iptables
# chains it never removes). An internal test network needs neither: without them our pods never
# touch iptables at all.
strip_iptables_plugins() {
  local conflist=/etc/cni/net.d/$NETWORK.conflist
  [ -f "$conflist" ] || lp_die "podman did not write $conflist (is its network backend CNI?)"
  /usr/bin/python3.11 - "$conflist" <<'EOF'
import json, sys
path = sys.argv[1]
with open(path) as f:
    config = json.load(f)
config['plugins'] = [p for p in config['plugins'] if p['type'] not in ('portmap', 'firewall')]
with open(path, 'w') as f:
    json.dump(config, f, indent=2)
EOF
}

up() {
  local key have
  lp_require_root
  lp_require_commands podman runc iptables /usr/bin/python3.11 ldd "$PYTHON"
  configure
  key=$(image_key)
  have=$(podman image inspect --format '{{index .Labels "lp.testbed.key"}}' "$IMAGE" 2>/dev/null || true)
  if [ "$have" != "$key" ]; then
    echo "building $IMAGE (key $key)" >&2
    build_image "$key"
    podman image prune --force >/dev/null  # the previous build, now untagged
  fi
  if ! podman network exists "$NETWORK"; then
    create_network
    strip_iptables_plugins
  fi
  echo "image $IMAGE network $NETWORK subnet $SUBNET"
}

# Creating a network, podman reads the host's routes and their interfaces; while another bed
# changes its links (the SSH bed cuts a host off for up to 35 s), that fails with "no such
# network interface" for a while: try again for up to 90 s.
create_network() {
  local error deadline=$((SECONDS + 90))
  until error=$(podman network create --internal --subnet "$SUBNET" "$NETWORK" 2>&1 >/dev/null); do
    case $error in
      *"no such network interface"*) [ "$SECONDS" -lt "$deadline" ] && sleep 1 && continue;;
    esac
    echo "$error" >&2
    return 1
  done
}

down() {
  local pods containers
  if command -v podman >/dev/null; then
    pods=$(podman pod ps -q --filter network="$NETWORK" 2>/dev/null || true)
    [ -z "$pods" ] || podman pod rm --force --time 2 $pods >/dev/null
    containers=$( { podman ps -aq --filter network="$NETWORK"; podman ps -aq --filter ancestor="$IMAGE"; } 2>/dev/null | sort -u)
    [ -z "$containers" ] || podman rm --force --time 2 $containers >/dev/null
    if podman network exists "$NETWORK" 2>/dev/null; then podman network rm --force "$NETWORK" >/dev/null; fi
  fi
  lp_conf_restore "$CONTAINERS_CONF"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  purge)
    down
    if podman image exists "$IMAGE" 2>/dev/null; then podman rmi --force "$IMAGE" >/dev/null; fi ;;
  *) echo "usage: $0 up | down | purge" >&2; exit 2 ;;
esac
