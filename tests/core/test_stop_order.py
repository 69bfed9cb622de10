"""The stop in graph order: callers hear the stop before the nodes they call, so a stop handler
that flushes to a server still finds it serving (the program is in tests/stop_programs.py)."""
import pytest

import launchpad as lp
from tests import stop_programs


@pytest.mark.parametrize('launch_type, colocate', [
    ('test_mt', False), ('test_mp', False), ('test_mp', True)])
def test_dqn_stops_in_graph_order_and_nothing_is_killed(launch_type, colocate, tmp_path):
    """Acme's distributed DQN shape: the actors' stop handlers flush to the replay, which keeps
    serving until they have ended; the learner (which ignores the stop) ends after the actors,
    the replay and the counter last, and no node is killed."""
    record = tmp_path / 'flushed.txt'
    controller = lp.launch(stop_programs.dqn_program(str(record), colocate=colocate),
                           launch_type=launch_type, notice_period=30)
    assert controller.wait(timeout=120)
    states = {name: status.state for name, status in controller.status().items()}
    assert set(states.values()) == {lp.NodeState.FINISHED}, states
    assert record.read_text().split() == ['0', '1', '2']  # every actor's last flush arrived
