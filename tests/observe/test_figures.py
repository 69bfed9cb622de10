"""figures: raw reports attributed to the program's executables, and rates between reports."""
from __future__ import annotations

import launchpad as lp
from launchpad.observe import figures
from launchpad.process.coordinator import NodeState, NodeStatus


class Service:
    def ping(self):
        return 'pong'


def user(*handles):
    del handles


def _program() -> lp.Program:
    program = lp.Program('p')
    server = program.add_node(lp.CourierNode(Service), label='server')
    inner = lp.PyNode(user, server)
    program.add_node(lp.MultiThreadingColocation([inner, lp.PyNode(user)]), label='colocated')
    program.add_node(lp.PyNode(user, server), label='user')
    return program


def test_edges_run_from_caller_to_callee_and_inner_nodes_count_for_their_colocation():
    graph = figures.Graph.of(_program(), ['server/0', 'colocated/0', 'user/0'])
    assert sorted(graph.edges) == [('colocated/0', 'server/0'), ('user/0', 'server/0')]
    assert graph.executable_of('colocated/0/1') == 'colocated/0'
    assert graph.executable_of('elsewhere/0') is None


def _report(taken: float, served: int, called: int, *, failed: int = 0) -> dict:
    methods = lambda calls, errors: {'ping': {'calls': calls, 'errors': errors,  # noqa: E731
                                              'seconds': calls * 0.001, 'buckets': []}}
    return {'time': taken, 'values': {('p', 'user/0'): {'steps': ['counter', 7.0, taken]}},
            'tables': [
                {'role': 'server', 'address': 'unix:/s', 'owner': ('p', 'server/0'),
                 'methods': methods(served, 0)},
                {'role': 'client', 'address': 'unix:/s', 'owner': ('p', 'colocated/0/0'),
                 'methods': methods(called, failed)},
                {'role': 'client', 'address': 'unix:/coordinator', 'owner': ('p', 'user/0'),
                 'methods': {'wait_for_stop': {'calls': 3, 'errors': 0, 'seconds': 3.0,
                                               'buckets': []}}},
                {'role': 'server', 'address': 'unix:/other', 'owner': ('q', 'server/0'),
                 'methods': methods(99, 0)}]}


def test_rates_come_from_the_reports_own_times_and_stop_when_reports_stop():
    graph = figures.Graph.of(_program(), ['server/0', 'colocated/0', 'user/0'])
    status = {name: NodeStatus(name, NodeState.RUNNING, started_at=100.0) for name in graph.nodes}
    first = figures.merge([_report(100.0, 10, 10)], graph, 'p')
    assert [t['target'] for t in first['clients']] == ['server/0', 'coordinator']
    assert first['values'] == {'user/0': {'steps': ['counter', 7.0, 100.0]}}
    before = figures.totals(first, 100.5, None)
    after = figures.totals(figures.merge([_report(102.0, 30, 30, failed=2)], graph, 'p'),
                           102.5, before)
    rows = {row['name']: row for row in figures.node_rows(status, after, {})}
    assert rows['server/0']['calls'] == 30 and rows['server/0']['calls_per_s'] == 10.0
    assert rows['server/0']['uptime'] == 2.5 and rows['server/0']['restarts'] == 0
    edges = sorted(figures.edge_rows(graph, after), key=lambda row: row['source'])
    assert edges[0] == {'source': 'colocated/0', 'target': 'server/0', 'in_graph': True,
                        'calls': 30, 'calls_per_s': 10.0, 'errors_per_s': 1.0,
                        'latency_ms': edges[0]['latency_ms']}
    assert abs(edges[0]['latency_ms'] - 1.0) < 1e-9
    assert edges[1]['calls_per_s'] == 0.0  # user/0 -> server/0: no calls yet
    # A sample without a new report keeps the rates; a report too old gives none.
    same = figures.totals(figures.merge([_report(102.0, 30, 30)], graph, 'p'), 103.0, after)
    assert same.served['server/0'].calls_per_s == 10.0
    stale = figures.totals(figures.merge([_report(102.0, 30, 30)], graph, 'p'),
                           102.0 + figures.STALE_AFTER + 1, after)
    assert stale.served['server/0'].calls_per_s == 0.0
    plotted = figures.plotted(list(rows.values()), first['values'])
    assert plotted['calls served/s']['server/0'] == 10.0 and plotted['steps'] == {'user/0': 7.0}


def test_the_newest_report_of_a_value_wins_whatever_the_order_of_the_snapshots():
    """A node process's fresh report is not hidden by an old value left in the launching
    process (by an ended thread program of the same name, whose snapshot is merged last)."""
    graph = figures.Graph.of(_program(), ['server/0', 'colocated/0', 'user/0'])
    fresh = {'time': 20.0, 'tables': [], 'values': {('p', 'user/0'): {
        'loss': ['gauge', 0.5, 19.0]}}}
    stale = {'time': 21.0, 'tables': [], 'values': {('p', 'user/0'): {
        'loss': ['gauge', 9.0, 3.0], 'old': ['gauge', 1.0, 3.0]}}}
    merged = figures.merge([fresh, stale], graph, 'p')
    assert merged['values']['user/0'] == {'loss': ['gauge', 0.5, 19.0], 'old': ['gauge', 1.0, 3.0]}
