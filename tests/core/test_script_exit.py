"""A script that launches a program and returns (no CLI, no explicit wait) runs it to the end."""
import textwrap

import pytest

from tests.core.conftest import run_script

pytestmark = pytest.mark.timeout(60)

_SCRIPT = textwrap.dedent('''
    import sys
    import launchpad as lp

    class Echo:
        def echo(self, value):
            return value

    def client(echo, mode):
        futures = [echo.futures.echo(i) for i in range(3)]
        print('echoed', echo.echo('sync'), [f.result() for f in futures], flush=True)
        if mode == 'fail':
            raise ValueError('client broke')
        lp.stop()

    program = lp.Program('exit_wait')
    echo = program.add_node(lp.CourierNode(Echo), label='echo')
    program.add_node(lp.PyNode(client, echo, sys.argv[2]), label='client')
    lp.launch(program, launch_type=sys.argv[1])
''')


@pytest.mark.parametrize('launch_type', ['local_mt', 'local_mp'])
def test_script_returning_after_launch_runs_the_program_to_its_end(launch_type):
    result = run_script(_SCRIPT, launch_type, 'ok', timeout=50)
    assert result.returncode == 0, result.stderr
    assert "echoed sync [0, 1, 2]" in result.stdout


@pytest.mark.parametrize('launch_type', ['local_mt', 'local_mp'])
def test_script_returning_after_launch_exits_non_zero_naming_a_failed_node(launch_type):
    result = run_script(_SCRIPT, launch_type, 'fail', timeout=50)
    assert result.returncode == 1, result.stderr
    assert 'Node client/0 failed: ValueError: client broke' in result.stderr
