#!/usr/bin/env bash
# Builds the environment in which benchmarks/stop_order_bench.py --program acme runs Acme's
# distributed DQN, unchanged, on this checkout's launchpad: a CPython 3.9 virtualenv with dm-acme
# 0.4.0 and benchmarks/acme_requirements.txt (about 1.5 GB), outside the repository.
#
#   bash benchmarks/acme_env.sh VENV [PYTHON]      # PYTHON: a CPython 3.9 (default: python3.9)
#   VENV/bin/python benchmarks/stop_order_bench.py --program acme
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:?usage: acme_env.sh VENV [PYTHON]}"
python="${2:-python3.9}"

"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
# --no-deps: dm-acme 0.4.0 requires dm-launchpad==0.5.0, which would shadow ours as `launchpad`.
"$venv/bin/pip" install --quiet --no-deps dm-acme==0.4.0
"$venv/bin/pip" install --quiet -r "$repo/benchmarks/acme_requirements.txt"
# protobuf pinned here: launchpad alone would bring the newest, which TensorFlow 2.8 cannot load.
"$venv/bin/pip" install --quiet -e "$repo" protobuf==3.20.3

# jax 0.4.13 dropped jax.xla.Device and jax.xla.DeviceArray, which Acme 0.4.0 names in signatures
# at import. A .pth hook restores them as aliases of jax.Device and jax.Array the first time any
# process (the launcher or a node) imports acme; Acme's code itself stays as released.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cat > "$site/acme_jax_aliases.py" <<'PY'
"""Restores jax.xla.Device and jax.xla.DeviceArray (gone in jax 0.4) before acme is imported."""
import importlib.abc
import sys


class _AliasJaxBeforeAcme(importlib.abc.MetaPathFinder):

    def find_spec(self, name, path=None, target=None):
        if name == 'acme':
            sys.meta_path.remove(self)
            import jax
            jax.xla.Device = jax.Device
            jax.xla.DeviceArray = jax.Array
        return None


sys.meta_path.insert(0, _AliasJaxBeforeAcme())
PY
echo 'import acme_jax_aliases' > "$site/acme_jax_aliases.pth"
echo "Acme environment ready: $venv/bin/python benchmarks/stop_order_bench.py --program acme"
