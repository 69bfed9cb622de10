#!/usr/bin/env bash
# Runs tests/reverb in an environment of its own: a CPython 3.9-3.11 virtualenv with
# launchpad-ml[reverb] (dm-reverb 0.14 + TensorFlow 2.15, numpy<2; about 1.7 GB). The main test
# environment needs neither. The environment is kept and reused; delete it to rebuild.
#
#   bash tests/reverb/run.sh [pytest arguments]
#   bash tests/reverb/run.sh --build        # only make sure the environment is ready
#
# REVERB_PYTHON: the interpreter to build it from (default: python3.11).
# REVERB_VENV:   where to keep it (default: launchpad/reverb-venv in the user's cache directory).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
python="${REVERB_PYTHON:-python3.11}"
venv="${REVERB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/launchpad/reverb-venv}"

start=$SECONDS
if ! "$venv/bin/pip" show dm-reverb >/dev/null 2>&1; then
  echo "Building the Reverb environment in $venv"
  "$python" -m venv --clear "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  # The project with its reverb extra, so that the extra is tested too; built from a copy, since
  # pip builds in the source tree. Tests import launchpad from this checkout.
  source_copy="$(mktemp -d)"
  trap 'rm -rf "$source_copy"' EXIT
  cp -r "$repo/pyproject.toml" "$repo/README.md" "$repo/LICENSE" "$repo/launchpad" "$repo/courier" \
    "$repo/protos" "$source_copy"
  "$venv/bin/pip" install --quiet "$source_copy[reverb]" pytest pytest-timeout
fi
echo "Reverb environment ready after $((SECONDS - start)) s"
[ "${1:-}" = --build ] && exit 0

cd "$repo"
start=$SECONDS
status=0
# -o addopts=: in this process, without pyproject.toml's pytest-xdist workers (not installed here).
LAUNCHPAD_REVERB=required PYTHONPATH="$repo" TF_CPP_MIN_LOG_LEVEL=2 \
  "$venv/bin/python" -m pytest tests/reverb "tests/nodes/test_docs.py::test_doc_program_runs[replay]" \
  -p no:cacheprovider -o addopts= "$@" || status=$?
echo "Reverb tests took $((SECONDS - start)) s"
exit $status
