"""A program's metrics in the Prometheus text format, written by the `prometheus_client` library.

From one observer sample (`Observer.sample()`), every series labelled with `program` and `node`:

    launchpad_node_state{state}                  1 for the node's state, 0 for the others
    launchpad_node_uptime_seconds                since the node started (until it ended)
    launchpad_node_restarts_total                times its restart policy started it again
    launchpad_node_cpu_percent                   its process's CPU (100: one core) and resident
    launchpad_node_resident_memory_bytes         memory (node processes, not threads)
    courier_server_calls_total{method}           calls served, per method
    courier_server_errors_total{method}          of those, the ones that failed
    courier_server_call_seconds{method}          histogram of their latencies
    courier_client_calls_total{target,method}    calls made, by the node called (or the address
    courier_client_errors_total{target,method}   if it is no node of the program), per method
    courier_client_call_seconds{target,method}   histogram of their round trips
    NAME                                         each value of lp.report(NAME=...)
    NAME_total                                   each counter of lp.count(NAME=...)
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple

from courier import metrics as courier_metrics

from launchpad import metrics
from launchpad.process.states import NodeState

STATES = tuple(state.value for state in NodeState)


def content_type() -> str:
    import prometheus_client  # pylint: disable=import-outside-toplevel
    return prometheus_client.CONTENT_TYPE_LATEST


def exposition(sample: Dict[str, Any]) -> bytes:
    """The Prometheus text of one observer sample."""
    import prometheus_client  # pylint: disable=import-outside-toplevel
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(_Collector(sample))
    return prometheus_client.generate_latest(registry)


class _Collector:
    """A prometheus_client collector over one sample."""

    def __init__(self, sample: Dict[str, Any]):
        self._sample = sample

    def collect(self) -> Iterator[Any]:
        from prometheus_client import core  # pylint: disable=import-outside-toplevel
        program = self._sample.get('program', '')
        rows = self._sample.get('nodes', [])
        state = core.GaugeMetricFamily('launchpad_node_state', 'The node is in this state (1).',
                                       labels=['program', 'node', 'state'])
        uptime = _per_node(core.GaugeMetricFamily, 'launchpad_node_uptime_seconds',
                           'Seconds since the node started (until it ended).')
        restarts = _per_node(core.CounterMetricFamily, 'launchpad_node_restarts',
                             'Times the node was restarted.')
        for row in rows:
            for name in STATES:
                state.add_metric([program, row['name'], name], float(row['state'] == name))
            if row['uptime'] is not None:
                uptime.add_metric([program, row['name']], row['uptime'])
            restarts.add_metric([program, row['name']], row['restarts'])
        yield from (state, uptime, restarts)
        yield from _usage(core, program, rows)
        yield from _calls(core, 'server', program, self._sample.get('servers', []))
        yield from _calls(core, 'client', program, self._sample.get('clients', []))
        yield from _reported(core, program, self._sample.get('values', {}))


def _per_node(family, name: str, documentation: str) -> Any:
    """A metric family of one value per node."""
    return family(name, documentation, labels=['program', 'node'])


def _calls(core, role: str, program: str, tables) -> Iterator[Any]:
    """Calls, errors and latency histograms of one role's tables, summed per label set."""
    labels = ['program', 'node'] + (['target'] if role == 'client' else []) + ['method']
    summed: Dict[Tuple[str, ...], list] = {}
    for table in tables:
        key = [program, table['node']]
        if role == 'client':
            key.append(table['target'] or table['address'])
        for method, stats in table['methods'].items():
            total = summed.setdefault(tuple(key + [method]),
                                      [0, 0, 0.0, [0] * len(courier_metrics.LATENCY_BUCKETS)])
            total[0] += stats['calls']
            total[1] += stats['errors']
            total[2] += stats['seconds']
            total[3] = [a + b for a, b in zip(total[3], stats['buckets'])]
    what = 'served' if role == 'server' else 'made'
    calls = core.CounterMetricFamily(f'courier_{role}_calls', f'Courier calls {what}.',
                                     labels=labels)
    failed = core.CounterMetricFamily(f'courier_{role}_errors', f'Courier calls {what} that '
                                      f'failed.', labels=labels)
    latency = core.HistogramMetricFamily(f'courier_{role}_call_seconds',
                                         f'Latency of courier calls {what}.', labels=labels)
    for key, (count, errors, seconds, buckets) in sorted(summed.items()):
        calls.add_metric(list(key), count)
        failed.add_metric(list(key), errors)
        cumulative, running = [], 0
        for bound, number in zip(courier_metrics.LATENCY_BUCKETS, buckets):
            running += number
            cumulative.append(('+Inf' if bound == float('inf') else repr(bound), running))
        latency.add_metric(list(key), cumulative, seconds)
    yield from (calls, failed, latency)


def _reported(core, program: str, values: Dict[str, Dict[str, list]]) -> Iterator[Any]:
    """One family per name nodes reported with lp.report or lp.count."""
    families: Dict[str, Any] = {}
    for node, reported in sorted(values.items()):
        for name, (kind, value, _) in sorted(reported.items()):
            family = families.get(name)
            if family is None:
                make = (core.GaugeMetricFamily if kind == metrics.GAUGE
                        else core.CounterMetricFamily)
                family = families[name] = make(name, f'Reported by nodes with '
                                                     f'lp.{"report" if kind == metrics.GAUGE else "count"}.',
                                               labels=['program', 'node'])
            family.add_metric([program, node], value)
    yield from families.values()


def _usage(core, program: str, rows) -> Iterator[Any]:
    """CPU and memory of the nodes whose processes report them (`launchpad.observe.usage`)."""
    cpu = _per_node(core.GaugeMetricFamily, 'launchpad_node_cpu_percent',
                    "The node process's CPU use, in % of one core.")
    memory = _per_node(core.GaugeMetricFamily, 'launchpad_node_resident_memory_bytes',
                       "The node process's resident memory.")
    for row in rows:
        if row.get('cpu_percent') is not None:
            cpu.add_metric([program, row['name']], row['cpu_percent'])
        if row.get('rss_bytes') is not None:
            memory.add_metric([program, row['name']], row['rss_bytes'])
    yield from (cpu, memory)
