"""benchmarks/courier_bench.py runs, reports every number, and cleans up."""

from __future__ import annotations

import importlib

from tests.courier.conftest import REPO


def test_benchmark_smoke(capsys, monkeypatch):
    # Importable by name, so that its server process (spawned) can import it too.
    monkeypatch.syspath_prepend(str(REPO / 'benchmarks'))
    bench = importlib.import_module('courier_bench')
    results = bench.run(['tcp', 'uds', 'tls'], seconds=0.1, sizes=[1], baseline=True)
    assert sorted(results) == ['courier tcp', 'courier tls', 'courier uds', 'grpcio tcp',
                               'grpcio uds']  # (No bare grpcio beside TLS.)
    for numbers in results.values():
        assert numbers['sync']['calls_per_s'] > 0
        assert numbers['sync']['p50_us'] <= numbers['sync']['p99_us']
        assert numbers['futures']['calls_per_s'] > 0
        assert numbers['echo_1MiB']['mb_per_s'] > 0
    bench._print_table(results)  # pylint: disable=protected-access
    printed = capsys.readouterr().out
    assert 'courier uds / bare grpcio: sync' in printed and 'MB/s each way' in printed


def test_metrics_cost_benchmark_smoke(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / 'benchmarks'))
    bench = importlib.import_module('metrics_cost')
    results = bench.run(['uds'], seconds=0.1, rounds=1)
    for counting in ('on', 'off'):
        for measure in ('sync', 'futures'):
            assert results['uds'][counting][measure][0] > 0
        for measure in ('client_cpu_us', 'server_cpu_us'):  # counted in 10 ms ticks: a 0.1 s
            assert results['uds'][counting][measure][0] >= 0  # run on a busy machine may get none
        for measure in ('client_path_us', 'server_path_us', 'futures_path_us'):
            assert results['paths'][counting][measure][0] > 0
    bench.print_table(results)
    printed = capsys.readouterr().out
    assert 'uds    sync: server CPU us/call' in printed and 'paths  client code us/call' in printed
    results['uds']['off']['server_cpu_us'] = [0.0]  # no tick counted: the table still prints
    bench.print_table(results)
    assert '(none counted off)' in capsys.readouterr().out
