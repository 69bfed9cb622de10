"""What a node reports about itself: `lp.report` (gauges), `lp.count` (counters), and its calls.

Runs in every node. Values live in this process, per node, next to courier's call tables (each
tagged with the node that made its server or client, through `courier.metrics.set_owner`). A
node process sends all of it to the program's coordinator once a second (`start_reporting`,
started by the worker); nodes running as threads of the launching process are read there
directly (`snapshot`). The launching process's observer turns these into rates, plots and a
Prometheus endpoint (`launchpad.observe.observer`).
"""
from __future__ import annotations

import atexit
import math
import numbers
import os
import re
import threading
import time
from typing import Any, Dict, Optional, Tuple

from courier import errors as courier_errors
from courier import metrics as courier_metrics

from launchpad import runtime

# Seconds between two reports of a node process to its coordinator, and the call timeout its
# client should have (the last report, at exit, must never hold the exit up for long).
REPORT_INTERVAL = 1.0
REPORT_TIMEOUT = 2.0

GAUGE, COUNTER = 'gauge', 'counter'
_NAME = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*\Z')
_RESERVED = ('courier_', 'launchpad_')

Owner = Tuple[str, str]  # (program name, node name)

_lock = threading.Lock()
_values: Dict[Owner, Dict[str, list]] = {}  # owner -> name -> [kind, value, wall-clock time]


def _owner() -> Optional[Owner]:
    """The node running this code, as (program name, node name); None outside nodes."""
    try:
        context = runtime.get_context()
    except RuntimeError:
        return None
    return context.program_name, context.node_name


courier_metrics.set_owner(_owner)


def report(**gauges: float) -> None:
    """Sets gauges of the calling node, e.g. `lp.report(episode_return=21.0, loss=0.03)`.

    The dashboard plots each over time and the Prometheus endpoint exposes it as
    `name{program=..., node=...}`. Names are Prometheus names (letters, digits, `_`) and may not
    start with `courier_` or `launchpad_`.
    """
    _record(GAUGE, gauges)


def count(**increments: float) -> None:
    """Adds to counters of the calling node, e.g. `lp.count(episodes=1, env_steps=500)`.

    Counters start at 0 and only grow; the Prometheus endpoint exposes them as `name_total`.
    """
    for name, amount in increments.items():
        if isinstance(amount, numbers.Real) and not amount >= 0:
            raise ValueError(f'lp.count({name}={amount!r}): counters only grow; pass an amount '
                             f'>= 0, or use lp.report({name}=...) for a value that goes up and '
                             f'down.')
    _record(COUNTER, increments)


def _record(kind: str, values: Dict[str, Any]) -> None:
    function = 'lp.report' if kind == GAUGE else 'lp.count'
    owner = _owner()
    if owner is None:
        raise RuntimeError(f'{function}() reports a value of the node calling it, and no '
                           f'launchpad node runs here: call it inside a node of a launched '
                           f'program.')
    checked = {name: _number(function, name, value) for name, value in values.items()}
    now = time.time()
    with _lock:
        node = _values.setdefault(owner, {})
        for name, value in checked.items():
            entry = node.get(name)
            if entry is None:
                node[name] = [kind, value, now]
            elif entry[0] != kind:
                other = 'lp.report' if entry[0] == GAUGE else 'lp.count'
                raise ValueError(f'{function}({name}=...): node {owner[1]} already reports '
                                 f'{name!r} with {other}; a name is either a gauge '
                                 f'(lp.report) or a counter (lp.count), so pick another name.')
            else:
                entry[1] = value if kind == GAUGE else entry[1] + value
                entry[2] = now


def _number(function: str, name: str, value: Any) -> float:
    if not _NAME.match(name) or name.startswith(_RESERVED):
        raise ValueError(f'{function}({name}=...): metric names are letters, digits and _ '
                         f'(not starting with a digit, {" or ".join(_RESERVED)}); rename it, '
                         f'e.g. {re.sub("[^a-zA-Z0-9_]", "_", name).lstrip("0123456789")!r}.')
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        try:
            value = float(value)  # numpy scalars and 0-d arrays
        except (TypeError, ValueError):
            raise TypeError(f'{function}({name}={value!r}): values are numbers, got '
                            f'{type(value).__name__}.') from None
    value = float(value)
    if math.isinf(value) and function == 'lp.count':
        raise ValueError(f'lp.count({name}={value!r}): a counter cannot grow by infinity.')
    return value


def snapshot(program: Optional[str] = None) -> Dict[str, Any]:
    """This process's call tables, reported values (only `program`'s, if given) and usage.

    {'time': when it was taken, 'tables': [courier call tables, each with its owner],
    'values': {owner: {name: [kind, value, time]}}, 'process': `process_usage()`}.
    """
    taken = time.time()
    usage = process_usage()
    tables = courier_metrics.snapshot()
    with _lock:
        values = {owner: {name: list(entry) for name, entry in node.items()}
                  for owner, node in _values.items()}
    if program is not None:
        tables = [t for t in tables if t['owner'] is not None and t['owner'][0] == program]
        values = {owner: node for owner, node in values.items() if owner[0] == program}
    return {'time': taken, 'tables': tables, 'values': values, 'process': usage}


def process_usage() -> Dict[str, float]:
    """What this process uses: {'cpu_seconds' (user + system, its threads together), 'rss_bytes',
    'threads'}; the observer turns CPU seconds into a CPU % per node."""
    process = _this_process()
    with process.oneshot():
        cpu = process.cpu_times()
        return {'cpu_seconds': cpu.user + cpu.system, 'rss_bytes': float(process.memory_info().rss),
                'threads': float(process.num_threads())}


def _this_process():
    global _process  # pylint: disable=global-statement
    if _process is None or _process.pid != os.getpid():  # made again in a forked child
        import psutil  # pylint: disable=import-outside-toplevel
        _process = psutil.Process()
    return _process


_process = None


def start_reporting(name: str, coordinator) -> None:
    """Sends `snapshot()` to `coordinator.report_metrics(name, ...)` every REPORT_INTERVAL
    seconds from a daemon thread, and once more when the process exits; a coordinator without
    that method is left alone. `coordinator` is a client with a call timeout of REPORT_TIMEOUT."""
    unsupported = threading.Event()

    def send() -> None:
        if unsupported.is_set():
            return
        try:
            coordinator.report_metrics(name, snapshot())
        except courier_errors.UnknownMethodError:
            unsupported.set()
        except Exception:  # pylint: disable=broad-except  (the stop watcher handles a lost one)
            pass

    def loop() -> None:
        while not unsupported.is_set():
            time.sleep(REPORT_INTERVAL)
            send()

    threading.Thread(target=loop, daemon=True, name='lp-report').start()
    atexit.register(send)
