"""From what nodes report to what people look at: the graph, per-node rows and per-edge rates.

Pure functions over plain data, used by the observer in the launching process. Nodes report raw
cumulative numbers (`launchpad.metrics`): courier call tables tagged with the node that
owns each server or client, and the values of `lp.report` / `lp.count`. Here they are attributed
to the program's executables (the units the coordinator tracks), a client's calls to the
executable serving the address it called, and turned into rates between two samples.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, List, Optional, Tuple

from launchpad import runtime
from launchpad.process.states import NodeStatus
from launchpad.process.faces import NODE_METHODS
from launchpad.program import Program

COORDINATOR = 'coordinator'


@dataclasses.dataclass
class Graph:
    """The program as the observer draws it.

    Attributes:
      nodes: executable names, as the coordinator and the controller's status name them.
      edges: (caller, callee) executables: the caller was given a handle of the callee.
    """
    nodes: List[str]
    edges: List[Tuple[str, str]]

    @classmethod
    def of(cls, program: Program, executables: Iterable[str]) -> 'Graph':
        graph = cls(list(executables), [])
        for callee, caller in program.edges:
            pair = (graph.executable_of(caller.name), graph.executable_of(callee.name))
            if None not in pair and pair[0] != pair[1] and pair not in graph.edges:
                graph.edges.append(pair)
        return graph

    def executable_of(self, node_name: Optional[str]) -> Optional[str]:
        """The executable running node `node_name` ('group/index', or an inner node of a
        colocation, 'group/index/i'); None if none does."""
        if node_name is None:
            return None
        for name in self.nodes:
            for part in name.split('+'):
                if node_name == part or node_name.startswith(part + '/'):
                    return name
        return None


# Seconds after which a node's last report no longer gives its rates (it ended, or is stuck).
STALE_AFTER = 3.0


@dataclasses.dataclass
class Counts:
    """The cumulative calls of one node's servers, or along one edge, as last reported, and
    the rates since the report before."""
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    reported: float = 0.0  # when the newest report counted here was taken
    calls_per_s: float = 0.0
    errors_per_s: float = 0.0
    latency_ms: Optional[float] = None


@dataclasses.dataclass
class Totals:
    """Counts of one moment, per node (its servers) and per edge (caller, callee)."""
    time: float
    served: Dict[str, Counts]
    edges: Dict[Tuple[str, str], Counts]


def merge(reports: Iterable[Dict[str, Any]], graph: Graph, program: str,
          ignored: Iterable[str] = ()) -> Dict[str, Any]:
    """Merges snapshots (`launchpad.metrics.snapshot()`) of the program's processes into one.

    Returns {'servers': [{'node', 'address', 'methods', 'time'}], 'clients': [{'node', 'target',
    'address', 'methods', 'time'}], 'values': {node: {name: [kind, value, time]}}}, with every table of
    a node of `program` attributed to its executable; a client table's `target` is the executable
    serving the address it calls ('coordinator' for the coordinator, None if it is neither
    one of the program's servers nor the coordinator). Tables of
    the addresses in `ignored` (the observer's own server) are left out.
    """
    ignored = set(ignored)
    servers, clients, values = [], [], {}
    for snapshot in reports:
        for table in snapshot.get('tables', ()):
            owner = table.get('owner')
            if not owner or owner[0] != program or table['address'] in ignored:
                continue
            node = graph.executable_of(owner[1])
            if node is None:
                continue
            row = {'node': node, 'address': table['address'], 'methods': table['methods'],
                   'time': snapshot.get('time')}
            (servers if table['role'] == 'server' else clients).append(row)
        for owner, reported in snapshot.get('values', {}).items():
            node = graph.executable_of(owner[1]) if owner[0] == program else None
            if node is None:
                continue
            kept = values.setdefault(node, {})
            for name, entry in reported.items():  # the newest report of each value wins
                if name not in kept or entry[2] >= kept[name][2]:
                    kept[name] = entry
    serving = {table['address']: table['node'] for table in servers}
    for table in clients:
        table['target'] = serving.get(table['address'])
        # Calls of the coordinator's node face only, at an address no node serves: a node's
        # client of the coordinator (the worker's reports, stop watch and lookups).
        if table['target'] is None and set(table['methods']) <= NODE_METHODS:
            table['target'] = COORDINATOR
    return {'servers': servers, 'clients': clients, 'values': values}


def totals(merged: Dict[str, Any], now: float, before: Optional[Totals]) -> Totals:
    """The cumulative calls of each node's servers and along each edge, with their rates
    between the two latest reports that counted them (reports arrive on their own clock; a
    sample without a new one keeps the rates; a report older than STALE_AFTER gives none)."""
    served: Dict[str, Counts] = {}
    for table in merged['servers']:
        _add(served.setdefault(table['node'], Counts()), table)
    edges: Dict[Tuple[str, str], Counts] = {}
    for table in merged['clients']:
        if table['target'] not in (None, COORDINATOR, table['node']):
            _add(edges.setdefault((table['node'], table['target']), Counts()), table)
    for counts, earlier in ([(c, before.served.get(k) if before else None)
                             for k, c in served.items()]
                            + [(c, before.edges.get(k) if before else None)
                               for k, c in edges.items()]):
        _rates(counts, earlier, now)
    return Totals(now, served, edges)


def _add(counts: Counts, table: Dict[str, Any]) -> None:
    for stats in table['methods'].values():
        counts.calls += stats['calls']
        counts.errors += stats['errors']
        counts.seconds += stats['seconds']
    counts.reported = max(counts.reported, table.get('time') or 0.0)


def _rates(counts: Counts, before: Optional[Counts], now: float) -> None:
    if before is None or now - counts.reported > STALE_AFTER:
        return
    elapsed = counts.reported - before.reported
    if elapsed <= 0:
        counts.calls_per_s, counts.errors_per_s = before.calls_per_s, before.errors_per_s
        counts.latency_ms = before.latency_ms
        return
    new_calls = counts.calls - before.calls
    counts.calls_per_s = max(0, new_calls) / elapsed
    counts.errors_per_s = max(0, counts.errors - before.errors) / elapsed
    counts.latency_ms = ((counts.seconds - before.seconds) / new_calls * 1e3 if new_calls > 0
                         else None)


def node_rows(status: Dict[str, NodeStatus], now_totals: Totals,
              ended_at: Dict[str, float]) -> List[Dict[str, Any]]:
    """One row per node: name, group, state, host, pid, uptime, restarts, its GPUs and cores
    (where the launcher handed them out), calls served (and per second), errors (and per
    second), last error."""
    rows = []
    for name, node in status.items():
        counts = now_totals.served.get(name, Counts())
        uptime = None
        if node.started_at is not None:
            uptime = max(0.0, ended_at.get(name, now_totals.time) - node.started_at)
        rows.append({
            'name': name, 'group': runtime.group_of(name), 'state': node.state.value,
            'host': node.host, 'pid': node.pid, 'uptime': uptime,
            'restarts': node.restarts, 'devices': node.devices, 'cores': node.cores,
            'calls': counts.calls, 'calls_per_s': counts.calls_per_s,
            'errors': counts.errors, 'errors_per_s': counts.errors_per_s,
            'error': node.error})
    return rows


def edge_rows(graph: Graph, now_totals: Totals) -> List[Dict[str, Any]]:
    """One row per edge of the graph, and per pair of nodes with calls outside it: caller,
    callee, calls (and per second), errors per second, mean latency (ms) of the latest calls."""
    pairs = list(graph.edges) + [pair for pair in now_totals.edges if pair not in graph.edges]
    rows = []
    for pair in pairs:
        counts = now_totals.edges.get(pair, Counts())
        rows.append({'source': pair[0], 'target': pair[1], 'in_graph': pair in graph.edges,
                     'calls': counts.calls, 'calls_per_s': counts.calls_per_s,
                     'errors_per_s': counts.errors_per_s, 'latency_ms': counts.latency_ms})
    return rows


def plotted(rows: List[Dict[str, Any]], values: Dict[str, Dict[str, list]]
            ) -> Dict[str, Dict[str, float]]:
    """What one sample adds to the plots: metric -> node -> value (calls served per second of
    every node, and every value nodes reported)."""
    sample: Dict[str, Dict[str, float]] = {
        'calls served/s': {row['name']: row['calls_per_s'] for row in rows}}
    for node, reported in values.items():
        for name, (_, value, _) in reported.items():
            sample.setdefault(name, {})[node] = value
    return sample
