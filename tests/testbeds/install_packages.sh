#!/usr/bin/env bash
# Installs the Debian packages the multi-host test beds need (run as root).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends tmux >/dev/null
