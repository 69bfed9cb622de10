"""Who waits on whom: the calls in flight between a program's nodes, and the cycles among them.

Pure functions over the `calls` answers of node processes (`probe.answer`, which reads
`courier.inflight`), used by the observer for `python -m launchpad.launch waits` and the
dashboard. A call is attributed to the node that made its client (or its server), and its callee
is the node serving the address it calls. Calls to the coordinator (the nodes' own stop watch,
reports and probes) are left out: they are always there and never the problem.

A cycle of nodes each waiting on the next is named a deadlock when every call in it has been in
flight for DEADLOCK_AGE seconds or more: two nodes that merely call each other now and then
form no lasting cycle, and a real deadlock never goes away.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

from launchpad.process.faces import NODE_METHODS

DEADLOCK_AGE = 1.0


def calls_in_flight(answers: Mapping[str, Optional[Dict[str, Any]]],
                    node_of: Callable[[Any, str], Optional[str]],
                    serving: Mapping[str, str]) -> Dict[str, Any]:
    """The program's calls in flight, oldest first, and its deadlocks.

    Args:
      answers: who answered (a node, or '' for the launching process) -> its `calls` answer
        ({'waiting': [...], 'serving': [...]}, as `courier.inflight.snapshot` gives them), or
        None if it gave none.
      node_of: (a call's owner, who answered) -> the node the call belongs to, or None for a
        call of no node of the program (an observer's, the coordinator's).
      serving: server address -> the node serving it.

    Returns:
      {'waits': [{'caller', 'thread', 'callee', 'address', 'method', 'age', 'future'}],
       'serving': [{'node', 'thread', 'method', 'age'}],
       'deadlocks': [[{'caller', 'callee', 'method', 'age', 'thread'}, ...], ...]}: each
      deadlock is a cycle of waits, the first one's caller the last one's callee.
    """
    waits, served = [], []
    for answerer, answer in answers.items():
        if not answer:
            continue
        for call in answer.get('waiting', ()):
            caller = node_of(call.get('owner'), answerer)
            callee = serving.get(call['address'])
            if caller is None or (callee is None and call['method'] in NODE_METHODS):
                continue
            waits.append({'caller': caller, 'thread': call['thread_name'],
                          'callee': callee or call['address'], 'address': call['address'],
                          'method': call['method'], 'age': call['age'],
                          'future': call.get('future', False)})
        for call in answer.get('serving', ()):
            node = serving.get(call['address']) or node_of(call.get('owner'), answerer)
            if node is None or call['address'] not in serving:
                continue
            served.append({'node': node, 'thread': call['thread_name'],
                           'method': call['method'], 'age': call['age']})
    waits.sort(key=lambda call: -call['age'])
    served.sort(key=lambda call: -call['age'])
    return {'waits': waits, 'serving': served, 'deadlocks': deadlocks(waits)}


def deadlocks(waits: List[Dict[str, Any]], min_age: float = DEADLOCK_AGE
              ) -> List[List[Dict[str, Any]]]:
    """The cycles of `waits` (from `calls_in_flight`) whose calls are all `min_age` or older,
    each once, starting at its smallest node name; the oldest call of each edge stands for it."""
    edges: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for call in waits:
        if call['age'] < min_age or call['caller'] == call['callee']:
            continue
        known = edges.setdefault(call['caller'], {}).get(call['callee'])
        if known is None or call['age'] > known['age']:
            edges[call['caller']][call['callee']] = call
    cycles = []

    def extend(path: List[str]) -> None:
        for callee in sorted(edges.get(path[-1], {})):
            if callee == path[0]:
                cycles.append([_edge(edges[a][b]) for a, b in zip(path, path[1:] + [path[0]])])
            elif callee > path[0] and callee not in path:
                extend(path + [callee])

    for start in sorted(edges):
        extend([start])
    cycles.sort(key=lambda cycle: -min(edge['age'] for edge in cycle))
    return cycles


def _edge(call: Dict[str, Any]) -> Dict[str, Any]:
    return {key: call[key] for key in ('caller', 'callee', 'method', 'age', 'thread')}


def describe_cycle(cycle: List[Dict[str, Any]]) -> str:
    """'a/0 -> b/0 (step, 12.3 s) -> a/0 (get_params, 11.0 s)'."""
    parts = [cycle[0]['caller']]
    for edge in cycle:
        parts.append(f'{edge["callee"]} ({edge["method"]}, {edge["age"]:.1f} s)')
    return ' -> '.join(parts)
