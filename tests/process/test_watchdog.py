"""When the hang watchdog looks at its nodes (`launchpad.process.watchdog`)."""
import pytest

from launchpad.process import watchdog


def test_the_watchdog_looks_again_when_a_silent_nodes_deadline_passes():
    """Not up to a quarter deadline later: a hung node is restarted that much sooner."""
    assert watchdog.until_next_look([(3.0, 2.9)]) == pytest.approx(0.1)
    assert watchdog.until_next_look([(3.0, 2.9), (0.4, 0.0)]) == pytest.approx(0.1)
    # A node that makes progress is looked at every quarter deadline, at most every second.
    assert watchdog.until_next_look([(3.0, 0.0)]) == pytest.approx(0.75)
    assert watchdog.until_next_look([(60.0, 0.0)]) == pytest.approx(1.0)
    assert watchdog.until_next_look([]) == pytest.approx(1.0)
    # Right at the deadline: soon, but without spinning.
    assert 0.0 < watchdog.until_next_look([(3.0, 3.0)]) <= 0.01
