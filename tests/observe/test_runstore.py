"""The run file on samples made here: what is written once and what on every change, series
read back whole or thinned out, counters' last totals, CPU % from two reports, and the errors
that name the run asked for."""
from __future__ import annotations

import json

import pytest

from launchpad.observe import recorder, runstore, usage
from launchpad.scaling import Decision

DESCRIBE = {'id': 'toy-abc123', 'name': 'toy', 'launch_type': 'local_mp', 'host': 'here',
            'pid': 1, 'started': 1000.0, 'nodes': ['a/0'], 'edges': []}


def _sample(time: float, state: str, *, restarts: int = 0, failures=(), values=None,
            scaling=()) -> dict:
    row = {'name': 'a/0', 'state': state, 'host': 'here', 'pid': 7, 'restarts': restarts,
           'error': failures[-1][0] if failures else None, 'calls_per_s': 2.0 * time,
           'errors_per_s': 0.0, 'cpu_percent': None, 'rss_bytes': 5e6, 'threads': 3.0}
    return {'time': time, 'ended': state == 'failed', 'stop_reason': None, 'nodes': [row],
            'edges': [], 'values': values or {}, 'failures': {'a/0': list(failures)},
            'scaling': list(scaling)}


def test_a_run_file_keeps_changes_once_and_reads_back_series(tmp_path, monkeypatch):
    monkeypatch.setenv(runstore.ENV, str(tmp_path))
    kept = recorder.Recorder(DESCRIBE)
    boom = ('RuntimeError: boom', 'Traceback (most recent call last):\n  ...\nRuntimeError: boom')
    decision = Decision(time=3.0, group='a', size=1, wanted=2, target=2, reason='', spent=1.0)
    for second in range(1, 101):
        state = 'running' if second < 50 else 'restarting' if second < 60 else 'failed'
        kept.record(_sample(
            1000.0 + second, state, restarts=1 if second >= 55 else 0,
            failures=[boom] if second >= 50 else [],
            values={'a/0': {'loss': ['gauge', 1.0 / second, 1000.0 + second // 2],
                            'steps': ['counter', float(second // 2), 1000.0 + second // 2]}},
            scaling=[decision] if second >= 3 else []))
    kept.close()
    connection = runstore.connect(tmp_path / DESCRIBE['id'] / runstore.FILE)
    rows = connection.execute('SELECT state, restarts FROM node_states ORDER BY time').fetchall()
    assert rows == [('running', 0), ('restarting', 0), ('restarting', 1), ('failed', 1)]
    assert connection.execute('SELECT node, attempt, traceback FROM failures').fetchall() == [
        ('a/0', 1, boom[1])]
    assert connection.execute('SELECT restart FROM restarts').fetchall() == [(1,)]
    assert connection.execute('SELECT group_label, target FROM scaling').fetchall() == [('a', 2)]
    # A value reported once is written once, however many samples see it.
    assert connection.execute("SELECT count(*) FROM metrics WHERE name = 'loss'").fetchone() == (51,)
    assert connection.execute("SELECT count(*) FROM metrics WHERE name = 'launchpad_cpu_percent'"
                              ).fetchone() == (0,)  # None: not known, not written
    run = runstore.read_run(connection)
    assert run['ended'] == 1100.0 and run['nodes'] == ['a/0']
    assert run['last_view']['nodes'][0]['state'] == 'failed'

    whole = {s['name']: s for s in runstore.read_series(connection, points=0)['series']}
    assert len(whole['launchpad_calls_per_s']['points']) == 100
    thinned = {s['name']: s for s in runstore.read_series(connection, points=10)['series']}
    calls = thinned['launchpad_calls_per_s']['points']
    assert 10 <= len(calls) <= 11
    # Slices of 10 s from the first row (loss, reported at 1000): the first holds 1001..1009.
    assert calls[0] == [1009.0, pytest.approx(2.0 * sum(range(1001, 1010)) / 9)]
    steps = thinned['steps']
    assert steps['kind'] == 'counter' and steps['points'][-1][1] == 50.0  # its last total
    # Slices of 10 s or more come from metrics_10s: a row per series and 10 s.
    assert connection.execute("SELECT count(*), min(value) FROM metrics_10s WHERE name = "
                              "'launchpad_calls_per_s'").fetchone() == (11, 2.0 * 1005)
    coarse = {s['name']: s for s in runstore.read_series(connection, points=4)['series']}
    assert len(coarse['launchpad_calls_per_s']['points']) <= 5
    assert coarse['steps']['points'][-1] == [1050.0, 50.0]  # reported last at 1050
    ranged = runstore.read_series(connection, 1020.0, 1030.0, 0)['series']
    assert {len(s['points']) for s in ranged if s['name'] == 'launchpad_rss_bytes'} == {11}
    connection.close()
    assert json.loads(json.dumps(runstore.runs()))[0]['id'] == DESCRIBE['id']
    # A new supervisor that re-adopted the program writes on where the dead one stopped.
    again = recorder.Recorder(DESCRIBE)
    again.record(_sample(1101.0, 'failed', restarts=1, failures=[boom], scaling=[decision]))
    again.close()
    connection = runstore.connect(tmp_path / DESCRIBE['id'] / runstore.FILE)
    assert [connection.execute(f'SELECT count(*) FROM {table}').fetchone()[0]
            for table in ('node_states', 'failures', 'restarts', 'scaling')] == [4, 1, 1, 1]
    connection.close()


def test_runs_are_found_by_id_start_or_name_and_forget_spares_running_ones(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv(runstore.ENV, str(tmp_path))
    for suffix, started in (('aaa111', 1.0), ('aab222', 2.0)):
        writer = runstore.RunWriter(tmp_path / f'toy-{suffix}',
                                    {**DESCRIBE, 'id': f'toy-{suffix}', 'started': started})
        writer.close()
    assert runstore.find('toy-aab').name == 'toy-aab222'
    assert runstore.find('toy').name == 'toy-aab222'  # a name: its latest run
    assert runstore.find(str(tmp_path / 'toy-aaa111')).name == 'toy-aaa111'
    with pytest.raises(runstore.RunError, match="2 runs match 'toy-aa': toy-aaa111, toy-aab222"):
        runstore.find('toy-aa')
    with pytest.raises(runstore.RunError, match="no kept run is named 'other'"):
        runstore.find('other')
    with pytest.raises(runstore.RunError, match='toy-aaa111.*is still running; stop it first'):
        runstore.forget(tmp_path / 'toy-aaa111', running_ids=['toy-aaa111'])
    assert runstore.forget(tmp_path / 'toy-aaa111', running_ids=[])['id'] == 'toy-aaa111'
    assert [run['id'] for run in runstore.runs()] == ['toy-aab222']


def test_cpu_percent_comes_from_two_reports_of_one_process():
    rates = usage.UsageRates()
    report = lambda time, cpu: {'time': time, 'process': {  # noqa: E731
        'cpu_seconds': cpu, 'rss_bytes': 1e6, 'threads': 2.0}}
    assert rates.update({'a/0': report(10.0, 5.0)})['a/0']['cpu_percent'] is None
    assert rates.update({'a/0': report(12.0, 6.0)})['a/0']['cpu_percent'] == 50.0
    assert rates.update({'a/0': report(12.0, 6.0)})['a/0']['cpu_percent'] == 50.0  # no new one
    assert rates.update({'a/0': report(13.0, 0.5)})['a/0']['cpu_percent'] is None  # restarted
    assert rates.update({'b/0': {'time': 1.0, 'tables': []}}) == {}  # a thread: no usage
