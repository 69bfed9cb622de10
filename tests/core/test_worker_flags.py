"""absl flags of the launching process reach worker processes with their values."""
import textwrap

import pytest

from tests.core.conftest import run_script

pytestmark = pytest.mark.timeout(60)

_LAUNCHER_SIDE = textwrap.dedent('''
    import sys
    from absl import flags
    from launchpad.launch import worker
    flags.DEFINE_integer('num', 3, 'a number')
    flags.DEFINE_enum('color', 'red', ['red', 'blue'], 'a color')
    flags.FLAGS(['launcher', '--num=7', '--color=blue'])
    import cloudpickle
    print(cloudpickle.dumps(worker.flags_snapshot()).hex())
''')

_WORKER_SIDE = textwrap.dedent('''
    import pickle, sys
    from absl import flags
    from launchpad.launch import worker
    shipped = pickle.loads(bytes.fromhex(sys.stdin.read()))
    spec = worker.WorkerSpec('p', 'local_mp', 'n/0', run=print, address_table=None,
                             coordinator_address='', flags=shipped)
    worker._install_flags(spec)
    print(flags.FLAGS.num, flags.FLAGS.color, flags.FLAGS['num'].present)
''')


def test_flag_values_set_in_the_launcher_reach_the_worker():
    launcher = run_script(_LAUNCHER_SIDE, timeout=50)
    assert launcher.returncode == 0, launcher.stderr
    assert 'cannot be sent' not in launcher.stderr
    worker = run_script(_WORKER_SIDE, input=launcher.stdout, timeout=50)
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.split() == ['7', 'blue', '1']
