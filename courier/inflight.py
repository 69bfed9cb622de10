"""Calls in flight: what this process's clients wait for and what its servers run, right now.

Every blocking call and every future of a :class:`courier.Client`, and every call a
:class:`courier.Server` runs, is listed here from its start to its end, so that a framework can
say at any moment who waits on whom (launchpad: ``python -m launchpad.launch waits``).
:func:`snapshot` reads the lists; nothing else reads them.

Listing a call costs a tuple, one dict insert and one dict pop, without a lock (the dict's own
atomicity suffices), on the calling thread: under a microsecond per call and side, which
``benchmarks/metrics_cost.py --feature inflight`` measures against the call rate. ``COURIER_INFLIGHT=off`` in the
environment (or :func:`set_enabled`) turns listing off for clients and servers made afterwards.

A future that fails without any response (timed out, unreachable, closed) is never taken off by
a response; :func:`snapshot` drops such entries once their future is done.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List

from courier import metrics

WAITING, SERVING = 'waiting', 'serving'

_enabled = os.environ.get('COURIER_INFLIGHT', 'on').lower() not in ('off', '0', 'false', 'no')

# id(entry) -> entry: (client or server, method, started (metrics.clock()), thread id), and for
# a client's future a list with a fifth item, the future (None until `call_async` returned it).
waiting: Dict[int, Any] = {}
serving: Dict[int, Any] = {}
# Entries after which a client's next future sweeps (`sweep`); the sweep doubles it as needed.
sweep_at = 4096


def _forget() -> None:
    waiting.clear()  # A forked child waits for none of its parent's calls.
    serving.clear()


os.register_at_fork(after_in_child=_forget)


def enabled() -> bool:
    """Whether clients and servers made now list their calls."""
    return _enabled


def set_enabled(on: bool) -> None:
    """Turns listing on or off for the clients and servers made from now on."""
    global _enabled  # pylint: disable=global-statement
    _enabled = bool(on)


def sweep() -> None:
    """Drops the entries of futures that ended without a response (see the module docstring)."""
    global sweep_at  # pylint: disable=global-statement
    for key, entry in list(waiting.items()):
        if _done(entry):
            waiting.pop(key, None)
    sweep_at = max(4096, 2 * len(waiting))


def snapshot() -> Dict[str, List[Dict[str, Any]]]:
    """The calls in flight now, oldest first: {'waiting': [...], 'serving': [...]}.

    Each call: 'address' (the server's), 'method', 'age' (seconds), 'thread' (id) and
    'thread_name' of the thread that waits or runs it (for a future: the thread that made it,
    which does not wait), 'future' (a client's future, not a blocking call), and 'owner' (what
    `metrics.set_owner`'s function said when the client connected or the server started, as a
    list, or None).
    """
    now = metrics.clock()
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    sweep()
    result: Dict[str, List[Dict[str, Any]]] = {WAITING: [], SERVING: []}
    for side, entries in ((WAITING, waiting), (SERVING, serving)):
        for entry in list(entries.values()):
            if _done(entry):
                continue
            holder, method, started, thread = entry[0], entry[1], entry[2], entry[3]
            table = getattr(holder, '_calls', None)
            owner = getattr(table, 'owner', None)
            try:
                address = holder.address
            except Exception:  # pylint: disable=broad-except  (a resolver that fails now)
                address = None
            result[side].append({
                'address': str(address) if address is not None else None, 'method': method,
                'age': max(0.0, now - started), 'thread': thread,
                'thread_name': names.get(thread, f'thread {thread}'),
                'future': len(entry) > 4,
                'owner': list(owner) if isinstance(owner, tuple) else owner})
        result[side].sort(key=lambda call: -call['age'])
    return result


def _done(entry) -> bool:
    return len(entry) > 4 and entry[4] is not None and entry[4].done()
