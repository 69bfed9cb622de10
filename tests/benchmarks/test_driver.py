"""The benchmark driver: peer discovery, the table and its ratios, and the CI smoke run."""
import json
import os
import subprocess
import sys

import pytest

import bench_catalog
import bench_harness
import peers
from .conftest import BENCHMARKS, REPO, load_driver

pytestmark = pytest.mark.timeout(300)


def _without_peers(monkeypatch):
    for var in peers.ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)


def test_unset_peer_is_skipped_naming_its_variable(monkeypatch):
    _without_peers(monkeypatch)
    found, skipped = peers.discover(['dmlp', 'ray'])
    assert found == []
    assert 'LAUNCHPAD_BENCH_DMLP_PYTHON is not set' in skipped['dmlp']
    assert 'LAUNCHPAD_BENCH_RAY_PYTHON is not set' in skipped['ray']


def test_peer_interpreter_that_is_not_a_program_is_skipped(monkeypatch, tmp_path):
    not_a_program = tmp_path / 'python'
    not_a_program.write_text('')
    monkeypatch.setenv('LAUNCHPAD_BENCH_RAY_PYTHON', str(not_a_program))
    found, skipped = peers.discover(['ray'])
    assert found == [] and 'is not an executable file' in skipped['ray']


def test_interpreter_without_dm_launchpad_is_not_taken_for_it(monkeypatch):
    # Our own interpreter has no dm-launchpad (and ours is never on a peer's path).
    monkeypatch.setenv('LAUNCHPAD_BENCH_DMLP_PYTHON', sys.executable)
    found, skipped = peers.discover(['dmlp'])
    assert found == []
    assert 'cannot import what the workloads need' in skipped['dmlp']


def test_peers_never_inherit_pythonpath(monkeypatch):
    monkeypatch.setenv('PYTHONPATH', REPO)
    system = peers.System('ray', 'Ray', 'ray', sys.executable, 'x.py')
    assert 'PYTHONPATH' not in system.env()
    ours, reason = peers._candidate('ours')
    assert reason is None and ours.env()['PYTHONPATH'].split(os.pathsep)[0] == REPO


def test_unknown_names_are_refused_with_the_known_ones(capsys):
    driver = load_driver()
    with pytest.raises(SystemExit):
        driver.parse_args(['--workloads', 'sync_calls,warp_speed'])
    err = capsys.readouterr().err
    assert 'warp_speed' in err and 'fanin_16_cached' in err
    with pytest.raises(SystemExit):
        driver.parse_args(['--systems', 'ours,mpi'])
    assert 'mpi' in capsys.readouterr().err


def _run(key, workload, metrics, error=None):
    run = {'key': key, 'workload': workload, 'metrics': metrics}
    if error:
        run['error'] = error
    return run


def test_table_gives_values_per_system_and_ratio_ours_over_peer():
    driver = load_driver()
    systems = [peers.System('ours', 'ours', 'launchpad', 'py', 's'),
               peers.System('dmlp', 'dm-launchpad', 'dm-launchpad', 'py', 's'),
               peers.System('ray', 'Ray', 'ray', 'py', 's')]
    runs = [_run('ours', 'sync_calls', {'calls_per_s': 12000.0, 'p50_us': 50.0}),
            _run('dmlp', 'sync_calls', {'calls_per_s': 6000.0, 'p50_us': 100.0}),
            _run('ray', 'sync_calls', {}, error='exited with status 1'),
            _run('ours', 'launch_1', {'launch_s': 0.5}),
            _run('dmlp', 'launch_1', {'launch_s': 2.0}),
            _run('ray', 'launch_1', {'launch_s': 4.0})]
    rows = driver.build_table(runs, systems, ['sync_calls', 'launch_1'])
    by_metric = {(r['workload'], r['metric']): r for r in rows}
    assert by_metric['sync_calls', 'calls_per_s']['ratios'] == {'dmlp': 2.0}
    assert by_metric['sync_calls', 'p50_us']['ratios'] == {'dmlp': 0.5}
    assert by_metric['launch_1', 'launch_s']['ratios'] == {'dmlp': 0.25, 'ray': 0.125}
    assert by_metric['launch_1', 'launch_s']['better'] == 'lower'
    text = driver.format_table(rows, systems)
    sync_line = next(l for l in text.splitlines() if l.startswith('sync_calls') and 'calls/s' in l)
    assert '12,000' in sync_line and '6,000' in sync_line and 'error' in sync_line
    assert '2.00x' in sync_line
    assert '0.12x' in next(l for l in text.splitlines() if l.startswith('launch_1'))


def test_latency_percentiles_are_nearest_rank_in_microseconds():
    summary = bench_harness.latency_summary([n * 1000 for n in range(100, 0, -1)])
    assert summary == {'p50_us': 50.0, 'p99_us': 99.0}
    with pytest.raises(ValueError):
        bench_harness.latency_summary([])


def test_quick_run_measures_every_workload_on_ours(tmp_path, monkeypatch):
    """The CI smoke: every workload runs on our library, reports numbers, and leaks nothing."""
    _without_peers(monkeypatch)
    out = tmp_path / 'quick.json'
    done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, 'run.py'), '--quick',
                           '--out', str(out)], capture_output=True, text=True, timeout=280,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report['quick'] is True
    assert report['systems']['ours']['available'] is True
    assert list(report['systems']) == ['ours']
    runs = {r['workload']: r for r in report['runs']}
    assert set(runs) == set(bench_catalog.WORKLOADS)
    for name, run in runs.items():
        assert 'error' not in run, (name, run.get('error'), run.get('log_tail'))
        assert run['system'] == 'launchpad'
        assert run['metrics'] and all(v > 0 for v in run['metrics'].values()), (name, run)
        assert 'leftover_pids' not in run['details'], (name, run['details'])
    assert 'ours' in done.stdout and 'fanin_16_cached' in done.stdout
