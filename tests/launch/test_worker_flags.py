"""absl flags of the launching process reach worker processes with their values."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(60)

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_LAUNCHER_SIDE = textwrap.dedent('''
    import sys
    from absl import app, flags
    from launchpad.launch import worker
    flags.DEFINE_integer('num', 3, 'a number')
    flags.DEFINE_enum('color', 'red', ['red', 'blue'], 'a color')
    flags.FLAGS(['launcher', '--num=7', '--color=blue'])
    import cloudpickle
    sys.stdout.buffer.write(cloudpickle.dumps(worker.flags_snapshot()))
''')

_WORKER_SIDE = textwrap.dedent('''
    import pickle, sys
    from absl import flags
    from launchpad.launch import worker
    shipped = pickle.loads(sys.stdin.buffer.read())
    spec = worker.WorkerSpec('p', 'local_mp', 'n/0', run=print, address_table=None,
                             coordinator_address='', flags=shipped)
    worker._install_flags(spec)
    print(flags.FLAGS.num, flags.FLAGS.color, flags.FLAGS['num'].present)
''')


def _python(code: str, stdin: bytes = b'') -> subprocess.CompletedProcess:
    path = [p for p in (os.environ.get('PYTHONPATH'), _REPO) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return subprocess.run([sys.executable, '-c', code], input=stdin, capture_output=True, env=env,
                          timeout=50, check=False)


def test_flag_values_set_in_the_launcher_reach_the_worker():
    launcher = _python(_LAUNCHER_SIDE)
    assert launcher.returncode == 0, launcher.stderr.decode()
    assert b'cannot be sent' not in launcher.stderr
    worker = _python(_WORKER_SIDE, launcher.stdout)
    assert worker.returncode == 0, worker.stderr.decode()
    assert worker.stdout.decode().split() == ['7', 'blue', '1']
