"""Scaling policies and the Scaler that applies them within bounds and budget (pure functions:
no program runs here)."""
import logging

import pytest

import launchpad as lp
from launchpad.scaling import METRIC_GRACE, Scaler, group_total


def test_the_scaler_clips_to_bounds_and_logs_why():
    scaler = Scaler(lambda metrics, now, sizes: {'actor': 12}, {'actor': lp.Elastic(max_size=4)})
    assert scaler.decide({}, 0.0, {'actor': 2}) == {'actor': 4}
    decision = scaler.log[-1]
    assert (decision.size, decision.wanted, decision.target) == (2, 12, 4)
    assert decision.reason == 'within [0, 4]'
    assert scaler.decide({}, 1.0, {'actor': 4}) == {}  # already there: nothing logged
    assert len(scaler.log) == 1


def test_a_spent_budget_shrinks_the_group_to_its_minimum():
    scaler = Scaler(lambda metrics, now, sizes: {}, {'actor': lp.Elastic(min_size=1,
                                                                         budget=10.0)})
    assert scaler.decide({}, 0.0, {'actor': 4}) == {}
    assert scaler.decide({}, 2.0, {'actor': 4}) == {}       # 8 node-seconds used
    assert scaler.decide({}, 3.0, {'actor': 4}) == {'actor': 1}  # 12: spent
    assert 'budget of 10 node-s spent (12)' in scaler.log[-1].reason


def test_a_policy_naming_a_group_that_is_not_elastic_is_an_error():
    scaler = Scaler(lambda metrics, now, sizes: {'learner': 3}, {'actor': lp.Elastic()})
    with pytest.raises(ValueError, match=r"\['learner'\], which are not elastic groups"):
        scaler.decide({}, 0.0, {'actor': 1})
    with pytest.raises(TypeError, match='scaling policy is a function'):
        Scaler('grow', {})


def test_queue_length_policy():
    policy = lp.QueueLengthPolicy('worker', 'backlog', per_node=10)
    assert policy({}, 0.0, {'worker': 2}) == {}  # nothing reported: no change
    assert policy({'queue/0': {'backlog': 35.0}}, 1.0, {'worker': 2}) == {'worker': 4}
    assert policy({'queue/0': {'backlog': 0.0}}, 2.0, {'worker': 4}) == {'worker': 0}
    with pytest.raises(ValueError, match='per_node'):
        lp.QueueLengthPolicy('worker', 'backlog', per_node=0)


def test_progress_per_actor_grows_while_it_pays_and_shrinks_when_it_does_not():
    policy = lp.ProgressPerActorPolicy('actor', 'learner', 'progress', round=1.0)

    def ask(now, progress, actors):
        return policy({'learner/0': {'progress': progress}}, now, {'actor': actors})

    assert ask(0.0, 0.0, 2) == {}               # the first measurement
    assert ask(0.5, 5.0, 2) == {}               # the round is not over
    assert ask(1.0, 10.0, 2) == {'actor': 3}    # 5 per actor-second: explore upwards
    assert ask(2.0, 40.0, 3) == {'actor': 4}    # 10 per actor-second: it paid, grow
    assert ask(3.0, 70.0, 4) == {'actor': 3}    # 7.5: it did not, shrink
    assert ask(4.0, 70.0, 1) == {'actor': 1}    # nothing: shrink, but keep one
    assert lp.ProgressPerActorPolicy()({}, 9.0, {'actor': 3}) == {}  # nothing reported


def test_group_total_sums_a_metric_over_a_group():
    metrics = {'learner/0': {'x': 1.0}, 'learner/1': {'x': 2.0}, 'actor/0': {'x': 5.0}}
    assert group_total(metrics, 'learner', 'x') == 3.0
    assert group_total(metrics, 'learner', 'y') is None


def test_a_policy_whose_metric_no_node_reports_warns_once_after_a_grace_period(caplog):
    policy = lp.QueueLengthPolicy('worker', 'backlog')
    reported = {'learner/0': {'loss': 1.0, 'steps': 3.0}, 'worker/1': {'done': 2.0}}
    with caplog.at_level(logging.WARNING):
        assert policy(reported, METRIC_GRACE - 1, {'worker': 2}) == {}  # a slow start
        assert not caplog.records
        for now in (METRIC_GRACE + 1, METRIC_GRACE + 2):
            assert policy(reported, now, {'worker': 2}) == {}
    assert len(caplog.records) == 1  # once
    message = caplog.records[0].getMessage()
    assert "no node has reported metric 'backlog'" in message
    assert 'learner: loss, steps; worker: done' in message
    assert policy({}, 0.0, {}) == {} and len(caplog.records) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # reported in time: no warning
        policy = lp.QueueLengthPolicy('worker', 'backlog')
        policy({'queue/0': {'backlog': 4.0}}, 1.0, {'worker': 1})
        policy({}, METRIC_GRACE + 1, {'worker': 1})
    assert not caplog.records


def test_progress_per_actor_warns_when_the_learner_does_not_report_its_metric(caplog):
    policy = lp.ProgressPerActorPolicy('actor', 'learner', 'progress')
    with caplog.at_level(logging.WARNING):
        assert policy({'actor/0': {'progress': 5.0}}, METRIC_GRACE + 1, {'actor': 2}) == {}
        policy({}, METRIC_GRACE + 2, {'actor': 2})
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "no node of group 'learner' has reported metric 'progress'" in message
    assert 'actor: progress' in message
