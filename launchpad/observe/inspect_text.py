"""The text of `stacks` and `waits` (`inspect_cli`), also shown by `top`: plain functions of
what the observer's `probe` and `waits` return."""
from __future__ import annotations

from typing import Any, Dict, List

from launchpad.observe import waits as waits_of
from launchpad.process import probe


def stacks(probed: Dict[str, Any], now: float) -> str:
    """The text `stacks` prints for an observer's `probe` of stacks taken at `now`."""
    parts = []
    for name, answer in probed['nodes'].items():
        if name in probed['in_process']:
            continue
        parts.append(f'== {name}: {describe_answer(answer, now)} ==\n')
        if answer.get('dumped'):
            parts.append(answer['dumped'].rstrip() + '\n\n')
        if answer.get(probe.STACKS):
            parts.append(_threads(answer[probe.STACKS]))
    process = probed.get('process')
    if process is not None:
        parts.append(f'== {", ".join(probed["in_process"])}: threads of the launching process '
                     f'(pid {process["pid"]}), live ==\n')
        parts.append(_threads(process[probe.STACKS]))
    return ''.join(parts)


def describe_answer(answer: Dict[str, Any], now: float) -> str:
    """'live (pid 12)', or why a node's answer is not live and how old what is shown is."""
    if answer.get('live'):
        return f'live (pid {answer["pid"]})'
    if answer.get('state') != 'running':
        return f'not running ({answer.get("state")})'
    silent = answer.get('silent')
    if silent is None:
        return ('running, but its probe thread was never heard from: it is starting, or its '
                'nodes call a coordinator that is not this launcher\'s (Kubernetes: the '
                'coordinator pod\'s)')
    text = (f'NO ANSWER; silent for {silent:.1f} s: its process holds the GIL (stuck in C '
            f'code), is stopped, or is gone' if silent > probe.STUCK_AFTER else
            f'no answer in time (slow; heard from {silent:.1f} s ago)')
    shown = []
    if answer.get('dumped'):
        shown.append("its stacks now, written by its fault handler (without the GIL, innermost "
                     "first)")
    if answer.get(probe.STACKS):
        shown.append(f'its last-known stacks, seen {now - answer["taken"]:.1f} s ago, unchanged '
                     f'for {answer["unchanged"]:.1f} s')
    return text + (f'. Below: {", then ".join(shown)}' if shown else '')


def _threads(threads: List[Dict[str, Any]]) -> str:
    lines = []
    for thread in threads:
        daemon = ', daemon' if thread.get('daemon') else ''
        lines.append(f'Thread {thread["name"]} ({thread["thread"]}{daemon}):')
        for file, line, function, *source in thread['frames']:
            lines.append(f'  File "{file}", line {line}, in {function}')
            if source and source[0]:
                lines.append(f'    {source[0]}')
        lines.append('')
    return '\n'.join(lines) + '\n'


def waits(result: Dict[str, Any]) -> str:
    """The text `waits` prints for an observer's `waits()`."""
    lines = []
    for cycle in result['deadlocks']:
        lines.append(f'DEADLOCK: {waits_of.describe_cycle(cycle)}')
    if result['deadlocks']:
        lines.append('')
    if result['waits']:
        lines.append('Calls in flight, oldest first:')
        lines.extend(table_lines(
            ['CALLER', 'THREAD', 'CALLEE', 'METHOD', 'AGE'],
            [[w['caller'], w['thread'] + (' (future)' if w['future'] else ''), w['callee'],
              w['method'], f'{w["age"]:.1f}s'] for w in result['waits']]))
    else:
        lines.append('No calls between nodes are in flight.')
    if result['serving']:
        lines.append('')
        lines.append('Calls the nodes serve now, oldest first:')
        lines.extend(table_lines(
            ['NODE', 'THREAD', 'METHOD', 'AGE'],
            [[s['node'], s['thread'], s['method'], f'{s["age"]:.1f}s']
             for s in result['serving']]))
    if result.get('silent'):
        lines.append('')
        lines.append(f'Did not answer (their calls are missing above): '
                     f'{", ".join(result["silent"])}; see `stacks`.')
    return '\n'.join(lines) + '\n'


def table_lines(header: List[str], rows: List[List[Any]]) -> List[str]:
    """`rows` under `header` in aligned columns."""
    cells = [header] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ['  '.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in cells]
