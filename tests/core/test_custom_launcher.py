"""A launcher written outside the package registers by name and runs programs."""
import importlib.util
import os

import pytest

import launchpad as lp

from tests.core.conftest import REPO


def load_example():
    path = os.path.join(REPO, 'examples', 'custom_launcher.py')
    spec = importlib.util.spec_from_file_location('custom_launcher', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_niceness(expected):
    assert os.nice(0) == expected, (os.nice(0), expected)


class Doubler:
    def double(self, x):
        return 2 * x


def use_doubler(doubler):
    assert doubler.double(21) == 42


def test_registered_custom_launcher_runs_a_program():
    example = load_example()
    lp.register_launcher('nice_for_test', lambda: example.PrefixLauncher(['nice', '-n', '7']))
    program = lp.Program('custom')
    doubler = program.add_node(lp.CourierNode(Doubler), label='doubler')
    with program.group('worker'):
        program.add_node(lp.PyNode(check_niceness, os.nice(0) + 7))
        program.add_node(lp.PyNode(use_doubler, doubler))
    controller = lp.launch(program, launch_type='nice_for_test')
    assert controller.wait(labels=['worker'], timeout=60)
    controller.stop()
    states = {name: status.state for name, status in controller.status().items()}
    assert states == {'doubler/0': lp.NodeState.FINISHED, 'worker/0': lp.NodeState.FINISHED,
                      'worker/1': lp.NodeState.FINISHED}


def test_custom_launcher_reports_failures_like_builtin_ones():
    example = load_example()
    lp.register_launcher('nice_for_test', example.PrefixLauncher)
    program = lp.make_program(lp.PyNode(check_niceness, -5))
    controller = lp.launch(program, launch_type='nice_for_test')
    with pytest.raises(lp.NodeFailedError) as caught:
        controller.wait(timeout=60)
    assert caught.value.node_name == 'check_niceness/0'
    assert 'AssertionError' in caught.value.message
