"""Finds the systems the benchmark driver can measure: ours, and the peers installed here.

Peers live in virtual environments outside the project, never in its environment. Two variables
name their interpreters:

- ``LAUNCHPAD_BENCH_DMLP_PYTHON``: a Python with DeepMind's dm-launchpad (see the peers notes for
  the recipe: Python 3.10, ``dm-launchpad[tensorflow]==0.5.2``, ``numpy<1.24``, ``protobuf<3.20``);
- ``LAUNCHPAD_BENCH_RAY_PYTHON``: a Python with ``ray``, ``numpy`` and ``psutil``.

A peer whose variable is unset, or whose interpreter cannot import what it needs, is skipped and
the reason is reported. Ours runs on the driver's own interpreter with the repository first on
PYTHONPATH. dm-launchpad's packages are called ``launchpad`` and ``courier`` too, so a peer never
inherits PYTHONPATH and always runs from a scratch working directory.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

BENCHMARKS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCHMARKS_DIR)
WORKLOADS_DIR = os.path.join(BENCHMARKS_DIR, 'workloads')

PROBE_TIMEOUT_S = 180.0


@dataclasses.dataclass(frozen=True)
class System:
    """One system under measurement and how to run a workload script for it."""
    key: str                 # 'ours', 'dmlp' or 'ray'
    title: str               # column title in the table
    reports_as: str          # the `system` name its workload script reports
    python: str
    script: str
    pythonpath: Tuple[str, ...] = ()
    version: str = ''

    def env(self) -> Dict[str, str]:
        """The environment a workload subprocess of this system starts with."""
        env = dict(os.environ)
        env.pop('PYTHONPATH', None)
        if self.pythonpath:
            env['PYTHONPATH'] = os.pathsep.join(self.pythonpath)
        return env

    def command(self, workload: str, quick: bool, timeout_s: float) -> List[str]:
        cmd = [self.python, self.script, '--workload', workload, '--json',
               '--timeout', f'{timeout_s:g}']
        return cmd + (['--quick'] if quick else [])


ENV_VARS = {'dmlp': 'LAUNCHPAD_BENCH_DMLP_PYTHON', 'ray': 'LAUNCHPAD_BENCH_RAY_PYTHON'}
KEYS = ('ours', 'dmlp', 'ray')

# What the launchpad workloads use of the shared dm-launchpad API.
_API = ('Program', 'CourierNode', 'PyNode', 'launch')

# Each probe prints one JSON object: the version, and where `launchpad` came from if relevant.
_PROBES = {
    'ours': ('import json, launchpad, courier, numpy, psutil\n'
             f'missing = [n for n in {_API!r} if not hasattr(launchpad, n)]\n'
             'if missing:\n'
             '    raise SystemExit(f"launchpad has no {\', \'.join(missing)} yet")\n'
             'print(json.dumps({"version": str(getattr(launchpad, "__version__", "dev")),'
             ' "file": launchpad.__file__}))\n'),
    'dmlp': ('import json, importlib.metadata as md, launchpad, courier, numpy, psutil\n'
             'dist = md.distribution("dm-launchpad")\n'
             'print(json.dumps({"version": dist.version, "file": launchpad.__file__,'
             ' "expected_dir": str(dist.locate_file("launchpad"))}))\n'),
    'ray': ('import json, ray, numpy, psutil\n'
            'print(json.dumps({"version": ray.__version__}))\n'),
}


def _candidate(key: str) -> Tuple[Optional[System], Optional[str]]:
    """The unprobed System for `key`, or None and why it cannot be one."""
    if key == 'ours':
        pythonpath = (REPO_ROOT, *filter(None, os.environ.get('PYTHONPATH', '').split(os.pathsep)))
        return System('ours', 'ours', 'launchpad', sys.executable,
                      os.path.join(WORKLOADS_DIR, 'launchpad_workloads.py'), pythonpath), None
    var = ENV_VARS[key]
    python = os.environ.get(var, '').strip()
    if not python:
        return None, f'{var} is not set (it names the peer\'s Python interpreter)'
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return None, f'{var}={python} is not an executable file'
    if key == 'dmlp':
        return System('dmlp', 'dm-launchpad', 'dm-launchpad', python,
                      os.path.join(WORKLOADS_DIR, 'launchpad_workloads.py')), None
    return System('ray', 'Ray', 'ray', python,
                  os.path.join(WORKLOADS_DIR, 'ray_workloads.py')), None


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def probe(system: System) -> Tuple[Optional[System], Optional[str]]:
    """Checks that `system`'s interpreter imports what its workloads need.

    Returns the system with its version filled in, or None and the reason it cannot run.
    """
    with tempfile.TemporaryDirectory(prefix='lpbench-probe-') as cwd:
        try:
            done = subprocess.run([system.python, '-c', _PROBES[system.key]], cwd=cwd,
                                  env=system.env(), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f'{system.python} could not be probed: {e}'
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ['(no output)'])[-1]
        return None, f'{system.python} cannot import what the workloads need: {last}'
    try:
        info = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f'{system.python} printed no probe result: {done.stdout[-200:]!r}'
    package_dir = os.path.dirname(info.get('file', ''))
    if system.key == 'ours' and not _same_dir(package_dir, os.path.join(REPO_ROOT, 'launchpad')):
        return None, (f'`import launchpad` found {package_dir}, not this repository\'s package: '
                      'is another launchpad installed first on the path?')
    if system.key == 'dmlp' and not _same_dir(package_dir, info['expected_dir']):
        return None, (f'`import launchpad` found {package_dir}, not dm-launchpad\'s package '
                      f'({info["expected_dir"]}): keep this repository off that '
                      'interpreter\'s path')
    return dataclasses.replace(system, version=info['version']), None


def discover(keys: Sequence[str] = KEYS) -> Tuple[List[System], Dict[str, str]]:
    """The runnable systems among `keys` (in that order) and, for the others, why not."""
    unknown = [k for k in keys if k not in KEYS]
    if unknown:
        raise ValueError(f'unknown systems {unknown}; known systems: {", ".join(KEYS)}')
    found, skipped = [], {}
    for key in keys:
        system, reason = _candidate(key)
        if system is not None:
            system, reason = probe(system)
        if system is None:
            skipped[key] = reason
        else:
            found.append(system)
    return found, skipped
