"""benchmarks/recover_bench.py runs a local_mp round: the supervisor killed, the new one's steps
read from its log, no node restarted (no timing is checked here)."""
import pytest

import recover_bench
from tests.launch.detached_program import Counter

pytestmark = pytest.mark.timeout(90)


def test_a_local_mp_round_times_the_new_supervisors_steps(tmp_path, monkeypatch):
    monkeypatch.setenv('LAUNCHPAD_LOGGING_DIR', str(tmp_path / 'logs'))
    [row], [attached] = recover_bench.local_mp_rounds(str(tmp_path), 1)
    assert row['restarts'] == 0 and attached > 0
    # The new supervisor logged when it started and re-adopted, then registered, in this order.
    steps = row['steps']
    assert 0 <= steps['started'] <= steps['re-adopted'] <= steps['registered'] <= row['status']
    assert 0 < row['readoption'] <= row['status']
    assert row['gap_before'] > 0 and row['gap_through'] >= row['gap_before']


def test_a_counter_without_a_file_says_what_it_served_in_its_output():
    said = 'x\nSERVED {"calls": 3, "longest_gap": 0.5}\nSERVED {"calls": 9, "longest_gap": 0.25}\n'
    assert Counter.parse(said) == {'calls': 9, 'longest_gap': 0.25}
    assert Counter.parse('nothing yet') == {'calls': 0, 'longest_gap': 0.0}
