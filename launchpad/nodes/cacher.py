"""`CacherNode`: a courier service that answers another courier node's methods from a cache.

Many requesters polling one source (actors fetching a learner's variables) put its load on the
cacher instead:

    learner = program.add_node(lp.CourierNode(Learner), label='learner')
    cached = program.add_node(lp.CacherNode(learner, refresh_interval_ms=2000,
                                            stale_after_ms=4000), label='cacher')
    # pass `cached` wherever `learner` would go: it has the same methods.
"""
from __future__ import annotations

import dataclasses
import functools
import pickle
import threading
import time
from typing import Any, Callable, Dict, Hashable, List, Optional

import courier

from launchpad.nodes.courier import CourierHandle, CourierNode


class CacherNode(CourierNode):
    """Serves every method of the courier node behind `handle`, caching results.

    A result is served from the cache for `refresh_interval_ms` after it was fetched; after that the
    next call still gets it but starts a refresh from the source, and once a result is
    `stale_after_ms` old it is never served: callers wait for a fresh one, or get the source's
    error (`courier.ServerUnavailableError` at once when the source is gone). Calls with different
    arguments are cached separately, concurrent misses of one call reach the source once, and a
    source error reaches its callers without being cached. Its handle is a `CourierHandle`, so a
    requester cannot tell the cacher from the source.

    Args:
      handle: the handle of a courier node (e.g. `lp.CourierNode`) to cache.
      refresh_interval_ms: how long a result is served before it is refreshed.
      stale_after_ms: how old a result may be when served; at least `refresh_interval_ms`.
      courier_kwargs: keyword arguments of the cacher's `courier.Server`.
      courier_client_kwargs: keyword arguments of the clients the cacher's handles dereference into.
    """

    def __init__(self, handle: CourierHandle, refresh_interval_ms: float = 1000,
                 stale_after_ms: float = 10000, *, courier_kwargs: Optional[dict] = None,
                 courier_client_kwargs: Optional[dict] = None):
        if not isinstance(handle, CourierHandle):
            raise TypeError(f'CacherNode caches a courier node: pass the handle that '
                            f'program.add_node(lp.CourierNode(...)) returned, got {handle!r}.')
        for name, value in (('refresh_interval_ms', refresh_interval_ms),
                            ('stale_after_ms', stale_after_ms)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f'{name} must be a number of milliseconds >= 0, got {value!r}.')
        if stale_after_ms < refresh_interval_ms:
            raise ValueError(f'stale_after_ms ({stale_after_ms}) must be at least '
                             f'refresh_interval_ms ({refresh_interval_ms}): a result is refreshed '
                             'before it goes stale.')
        super().__init__(_CachingForwarder, handle, refresh_interval_ms / 1000,
                         stale_after_ms / 1000, courier_kwargs=courier_kwargs,
                         courier_client_kwargs=courier_client_kwargs)


class _CachingForwarder:
    """Has one method per method of the `source` courier client; each answers from a `Cache`.

    It waits for the source to serve before it lists its methods (whatever the source client's
    `wait_for_ready`), but then fetches with `wait_for_ready=False`: once the source is gone,
    a caller the cache cannot serve gets the source's error at once instead of waiting for a
    source that may never come back.
    """

    def __init__(self, source: courier.Client, refresh_interval: float, stale_after: float):
        self._source = _failing_fast(source)
        self._cache = Cache(refresh_interval, stale_after)
        for method in _methods_of(source):
            setattr(self, method, functools.partial(self._call, method))

    def _call(self, method: str, *args, **kwargs) -> Any:
        key = _call_key(method, args, kwargs)
        return self._cache.get(key, lambda: getattr(self._source, method)(*args, **kwargs))


_FIRST_RETRY, _MAX_RETRY = 0.01, 1.0  # Seconds between attempts to list a source not up yet.


def _methods_of(source: courier.Client) -> List[str]:
    """The source's methods, once it serves (it may start after the cacher)."""
    delay = _FIRST_RETRY
    while True:
        try:
            return courier.list_methods(source)
        except courier.ServerUnavailableError:  # Not up yet (or its call_timeout passed).
            time.sleep(delay)
            delay = min(2 * delay, _MAX_RETRY)


def _failing_fast(source: courier.Client) -> courier.Client:
    """A client of the same server (address, timeout, token, TLS) with `wait_for_ready=False`."""
    state = source.__getstate__()  # What its pickle carries: its constructor's arguments.
    state['wait_for_ready'] = False
    return courier.Client(**state)


def _call_key(method: str, args: tuple, kwargs: dict) -> bytes:
    call = (method, args, sorted(kwargs.items()))
    try:
        return pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # pylint: disable=broad-except
        import cloudpickle  # pylint: disable=import-outside-toplevel
        return cloudpickle.dumps(call)


@dataclasses.dataclass
class _Entry:
    value: Any
    fetched_at: float


class _Fetch:
    """One call to the source that any number of callers wait for."""

    def __init__(self):
        self._done = threading.Event()
        self._value: Any = None
        self._error: Optional[BaseException] = None

    def run(self, fetch: Callable[[], Any]) -> None:
        try:
            self._value = fetch()
        except BaseException as e:  # pylint: disable=broad-except
            self._error = e
        self._done.set()

    @property
    def failed(self) -> bool:
        return self._error is not None

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class Cache:
    """Results by key, refreshed after `refresh_interval` s and never served after `stale_after` s.

    Thread-safe. At most one fetch per key is in flight; callers that find none usable wait for it.
    """

    def __init__(self, refresh_interval: float, stale_after: float,
                 clock: Callable[[], float] = time.monotonic):
        self._refresh_interval = refresh_interval
        self._stale_after = stale_after
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: Dict[Hashable, _Entry] = {}
        self._fetches: Dict[Hashable, _Fetch] = {}
        self._last_sweep = clock()

    def get(self, key: Hashable, fetch: Callable[[], Any]) -> Any:
        """The cached value of `key`, calling `fetch()` (once for all callers) when needed."""
        with self._lock:
            now = self._clock()
            self._sweep(now)
            entry = self._entries.get(key)
            age = None if entry is None else now - entry.fetched_at
            if age is not None and age < self._refresh_interval:
                return entry.value
            pending = self._fetches.get(key)
            start = pending is None
            if start:
                pending = self._fetches[key] = _Fetch()
            if age is not None and age < self._stale_after:  # serve it and refresh behind it
                if start:
                    threading.Thread(target=self._fetch, args=(key, pending, fetch, now),
                                     daemon=True, name='lp-cacher-refresh').start()
                return entry.value
        if start:
            self._fetch(key, pending, fetch, now)
        return pending.result()

    def _fetch(self, key: Hashable, pending: _Fetch, fetch: Callable[[], Any],
               started: float) -> None:
        pending.run(fetch)
        with self._lock:
            del self._fetches[key]
            if not pending.failed:
                self._entries[key] = _Entry(pending.result(), started)

    def _sweep(self, now: float) -> None:
        """Forgets stale entries (at most once per `stale_after`), so the cache cannot grow
        without bound when callers keep passing new arguments."""
        if now - self._last_sweep < self._stale_after:
            return
        self._last_sweep = now
        for key in [key for key, entry in self._entries.items()
                    if now - entry.fetched_at >= self._stale_after]:
            del self._entries[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
