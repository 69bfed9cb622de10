"""Call metrics: how many calls each courier server and client of this process made, per method.

Every started :class:`courier.Server` and every connected :class:`courier.Client` keeps a
:class:`CallTable` (shared by those of one address and owner): per method, the number of calls, how many failed, the seconds they took in
total and a histogram of their latencies (upper bounds :data:`LATENCY_BUCKETS`). A server counts
the time its method took (unpickling and pickling included) and a failure when the response is not
a result; a client counts the whole round trip and a failure when the call raised, whether the
error was the remote method's or the transport's (a future that fails without any response, e.g.
timed out, is not counted: counting it would take a callback per future).

:func:`snapshot` reads every live table of the process, which is what launchpad's nodes send to
their program. Recording costs a clock read and a few increments of the calling thread's own
counts per call on each side (no lock), so that counting is always on; ``COURIER_METRICS=off`` in the environment (or :func:`set_enabled`)
turns it off for servers and clients made afterwards, which is how ``benchmarks/metrics_cost.py``
measures what counting costs.

:func:`set_owner` lets a framework tag each table with who made it (launchpad: the node).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

# Upper bounds, in seconds, of the latency histogram's buckets; the last one catches the rest.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                   0.5, 1.0, 2.5, 5.0, 10.0, float('inf'))

SERVER, CLIENT = 'server', 'client'

# The clock calls are timed with: `started = clock()` before, `table.record(...)` after.
clock = time.perf_counter
_bucket = bisect.bisect_left

_enabled = os.environ.get('COURIER_METRICS', 'on').lower() not in ('off', '0', 'false', 'no')
_owner: Callable[[], Optional[str]] = lambda: None
# (role, address, owner) -> its table, shared by the servers or clients with that key while any
# of them lives.
_tables: 'weakref.WeakValueDictionary[tuple, CallTable]' = weakref.WeakValueDictionary()
_tables_lock = threading.Lock()


def _forget_tables() -> None:
    global _tables, _tables_lock  # pylint: disable=global-statement
    _tables, _tables_lock = weakref.WeakValueDictionary(), threading.Lock()


os.register_at_fork(after_in_child=_forget_tables)  # a forked child counts its own calls


class CallTable:
    """The calls of one server or one client, per method (see the module docstring).

    Each thread records into counts of its own, so recording takes no lock and no increment
    can be lost, with or without the GIL; `read` adds up the threads' counts. When a thread
    first records, the counts of threads that ended are folded into one, so that a table holds
    counts per live thread however many threads came and went.

    Attributes:
      role: ``'server'`` or ``'client'``.
      address: the server's address: its own for a server, the one called for a client.
      owner: who made it, as the function given to :func:`set_owner` said (None: nobody said).
    """

    __slots__ = ('role', 'address', 'owner', '_local', '_shards', '_ended', '_lock',
                 '__weakref__')

    def __init__(self, role: str, address: str, owner: Optional[str]):
        self.role = role
        self.address = address
        self.owner = owner
        self._local = threading.local()  # .methods: this thread's name -> counts
        self._shards: List[Tuple[threading.Thread, Dict[str, list]]] = []  # (thread, .methods)
        self._ended: Dict[str, list] = {}  # the counts of threads that ended, added up
        self._lock = threading.Lock()  # guards _shards and _ended

    def record(self, method: str, started: float, failed: bool) -> None:
        """Counts one call of ``method`` that began at ``clock()`` time ``started``."""
        elapsed = clock() - started
        try:
            stats = self._local.methods[method]
        except (AttributeError, KeyError):
            stats = self._new(method)
        stats[0] += 1
        if failed:
            stats[1] += 1
        stats[2] += elapsed
        stats[3][_bucket(LATENCY_BUCKETS, elapsed)] += 1

    def _new(self, method: str) -> list:
        """The calling thread's counts of ``method``, made: [calls, errors, seconds, buckets]."""
        methods = getattr(self._local, 'methods', None)
        if methods is None:
            methods = self._local.methods = {}
            with self._lock:
                live = []
                for thread, counts in self._shards:
                    if thread.is_alive():
                        live.append((thread, counts))
                    else:  # it records no more
                        _add(self._ended, counts)
                live.append((threading.current_thread(), methods))
                self._shards = live
        stats = methods[method] = [0, 0, 0.0, [0] * len(LATENCY_BUCKETS)]
        return stats

    def read(self) -> Dict[str, Any]:
        """This table as plain data: role, address, owner and per method its counts."""
        with self._lock:
            total = _add({}, self._ended)
            shards = [counts for _, counts in self._shards]
        for shard in shards:
            _add(total, shard)
        methods = {name: {'calls': calls, 'errors': errors, 'seconds': seconds, 'buckets': buckets}
                   for name, (calls, errors, seconds, buckets) in total.items()}
        return {'role': self.role, 'address': self.address, 'owner': self.owner,
                'methods': methods}

    def __repr__(self) -> str:
        return f'courier.metrics.CallTable({self.role}, {self.address!r}, owner={self.owner!r})'


def _add(total: Dict[str, list], counts: Dict[str, list]) -> Dict[str, list]:
    """Adds one thread's `counts` (method -> [calls, errors, seconds, buckets]) to `total`."""
    for name, (calls, errors, seconds, buckets) in list(counts.items()):
        stats = total.setdefault(name, [0, 0, 0.0, [0] * len(LATENCY_BUCKETS)])
        stats[0] += calls
        stats[1] += errors
        stats[2] += seconds
        stats[3] = [a + b for a, b in zip(stats[3], list(buckets))]
    return total


class _Uncounted:
    """The table of a server or client made while counting is off: records nothing."""

    __slots__ = ()

    def record(self, method: str, started: float, failed: bool) -> None:
        del method, started, failed


UNCOUNTED = _Uncounted()


def table(role: str, address: str) -> Any:
    """The table of a server or client of ``address``, tagged with its owner; listed by
    :func:`snapshot` while a server or client holds it. Servers or clients with the same role,
    address and owner share one table. :data:`UNCOUNTED` when counting is off."""
    if not _enabled:
        return UNCOUNTED
    try:
        owner = _owner()
    except Exception:  # pylint: disable=broad-except  (a tag is not worth failing a call for)
        owner = None
    key = (role, address, owner)
    with _tables_lock:
        found = _tables.get(key)
        if found is None:
            found = _tables[key] = CallTable(role, address, owner)
    return found


def snapshot() -> List[Dict[str, Any]]:
    """Every live table of this process, as :meth:`CallTable.read` gives it."""
    with _tables_lock:
        tables = list(_tables.values())
    return [made.read() for made in tables]


def set_owner(owner: Callable[[], Optional[str]]) -> None:
    """Makes ``owner()``, called where a server starts or a client first connects, tag its table."""
    global _owner  # pylint: disable=global-statement
    _owner = owner


def set_enabled(enabled: bool) -> None:
    """Turns counting on or off for the servers and clients made from now on."""
    global _enabled  # pylint: disable=global-statement
    _enabled = bool(enabled)
