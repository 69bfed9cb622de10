"""CacherNode: a courier node that answers another courier node's methods from a cache."""
import collections
import tempfile
import threading
import time

import pytest

import courier
import launchpad as lp
from launchpad.nodes.cacher import Cache

from tests.core.conftest import wait_until
from tests.nodes.conftest import LAUNCH_TYPES, in_threads, launch_and_wait


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class CountingFetch:
    """A source call that returns how many times it was made (optionally after `gate` opens)."""

    def __init__(self, gate=None, fail_first=False):
        self.calls = 0
        self._gate = gate
        self._fail_first = fail_first
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            self.calls += 1
            number = self.calls
        if self._gate is not None:
            assert self._gate.wait(10)
        if self._fail_first and number == 1:
            raise ValueError('source failed')
        return number


def test_fresh_results_come_from_the_cache():
    clock, fetch = FakeClock(), CountingFetch()
    cache = Cache(refresh_interval=1.0, stale_after=5.0, clock=clock)
    assert cache.get('k', fetch) == 1
    clock.now += 0.9
    assert cache.get('k', fetch) == 1
    assert fetch.calls == 1


def test_after_the_refresh_interval_the_old_result_is_served_while_it_refreshes():
    clock, gate = FakeClock(), threading.Event()
    fetch = CountingFetch(gate)
    cache = Cache(refresh_interval=1.0, stale_after=5.0, clock=clock)
    gate.set()
    assert cache.get('k', fetch) == 1
    gate.clear()
    clock.now += 2.0
    assert cache.get('k', fetch) == 1  # does not wait for the refresh
    assert cache.get('k', fetch) == 1  # nor starts a second one
    assert wait_until(lambda: fetch.calls == 2)
    gate.set()
    assert wait_until(lambda: cache.get('k', fetch) == 2)
    assert fetch.calls == 2


def test_stale_results_are_never_served():
    clock, fetch = FakeClock(), CountingFetch()
    cache = Cache(refresh_interval=1.0, stale_after=5.0, clock=clock)
    assert cache.get('k', fetch) == 1
    clock.now += 5.0
    assert cache.get('k', fetch) == 2


def test_arguments_are_cached_separately():
    clock, fetch = FakeClock(), CountingFetch()
    cache = Cache(refresh_interval=1.0, stale_after=5.0, clock=clock)
    assert [cache.get(key, fetch) for key in 'abab'] == [1, 2, 1, 2]


def test_errors_reach_the_caller_and_are_not_cached():
    clock, fetch = FakeClock(), CountingFetch(fail_first=True)
    cache = Cache(refresh_interval=1.0, stale_after=5.0, clock=clock)
    with pytest.raises(ValueError, match='source failed'):
        cache.get('k', fetch)
    assert cache.get('k', fetch) == 2


def test_a_failed_refresh_keeps_the_old_result_until_it_is_stale():
    clock = FakeClock()
    cache = Cache(refresh_interval=1.0, stale_after=5.0, clock=clock)
    assert cache.get('k', lambda: 'old') == 'old'
    clock.now += 2.0
    failures = []

    def failing():
        failures.append(1)
        raise ValueError('refresh failed')

    assert cache.get('k', failing) == 'old'
    assert wait_until(lambda: failures and not cache._fetches)  # pylint: disable=protected-access
    assert cache.get('k', failing) == 'old'  # the refresh failed: refreshes again, still serves
    clock.now += 5.0
    with pytest.raises(ValueError, match='refresh failed'):
        cache.get('k', failing)


def test_concurrent_misses_reach_the_source_once():
    gate = threading.Event()
    fetch = CountingFetch(gate)
    cache = Cache(refresh_interval=60.0, stale_after=120.0)  # a late caller gets the cached 1
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get('k', fetch)))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: fetch.calls == 1)
    time.sleep(0.05)  # let the other callers reach the cache too
    gate.set()
    for thread in threads:
        thread.join(10)
    assert results == [1] * 8
    assert fetch.calls == 1


def test_stale_entries_are_forgotten():
    clock = FakeClock()
    cache = Cache(refresh_interval=1.0, stale_after=5.0, clock=clock)
    for key in range(10):
        cache.get(key, lambda: 'value')
    assert len(cache) == 10
    clock.now += 6.0
    cache.get('new', lambda: 'value')
    assert len(cache) == 1


def test_bad_arguments_are_clear_errors():
    program = lp.Program('bad')
    source = program.add_node(lp.CourierNode(Source), label='source')
    plain = program.add_node(lp.PyNode(print), label='plain')
    with pytest.raises(TypeError, match='courier node'):
        lp.CacherNode(plain)
    with pytest.raises(ValueError, match='stale_after_ms .* must be at least refresh_interval_ms'):
        lp.CacherNode(source, refresh_interval_ms=2000, stale_after_ms=1000)
    with pytest.raises(ValueError, match='refresh_interval_ms must be a number'):
        lp.CacherNode(source, refresh_interval_ms=-1)
    assert isinstance(program.add_node(lp.CacherNode(source), label='cacher'), lp.CourierHandle)


class Source:
    """Counts the calls it gets, by method."""

    def __init__(self):
        self._calls = collections.Counter()
        self._lock = threading.Lock()

    def _count(self, method):
        with self._lock:
            self._calls[method] += 1
            return self._calls[method]

    def square(self, x):
        self._count('square')
        time.sleep(0.001)
        return x * x

    def slow(self):
        self._count('slow')
        time.sleep(0.5)
        return 'slow'

    def flaky(self):
        if self._count('flaky') == 1:
            raise ValueError('first call fails')
        return 'recovered'

    def calls(self):
        with self._lock:
            return dict(self._calls)


def check_cacher(cacher, source):
    """Runs in a node: requesters call the cacher; the source counts what reaches it."""
    assert courier.list_methods(cacher) == courier.list_methods(source)

    requesters, calls_each = 8, 50
    results = in_threads(requesters, lambda _: [cacher.square(3) for _ in range(calls_each)])
    assert results == [[9] * calls_each] * requesters
    assert source.calls()['square'] == 1  # the concurrent misses wait for one fetch

    assert (cacher.square(4), cacher.square(x=5), cacher.square(4)) == (16, 25, 16)
    assert source.calls()['square'] == 3

    assert in_threads(8, lambda _: cacher.slow()) == ['slow'] * 8
    assert source.calls()['slow'] == 1

    with pytest.raises(ValueError, match='first call fails'):
        cacher.flaky()
    assert cacher.flaky() == 'recovered'
    assert source.calls()['flaky'] == 2
    lp.stop()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_requesters_behind_a_cacher_spare_the_source(launch_type):
    program = lp.Program('cacher')
    source = program.add_node(lp.CourierNode(Source), label='source')
    # Nothing is refreshed while the test runs, however slowly (refreshes: the Cache tests above):
    # a refresh running behind a served call would reach the source at a moment of its own.
    cacher = program.add_node(
        lp.CacherNode(source, refresh_interval_ms=600_000, stale_after_ms=600_000),
        label='cacher')
    program.add_node(lp.PyNode(check_cacher, cacher, source), label='check')
    launch_and_wait(program, launch_type)


@pytest.fixture
def short_dir():
    """A directory with a short path: Unix socket paths are limited to 107 bytes."""
    with tempfile.TemporaryDirectory(prefix='lp-') as path:
        yield path


def test_once_the_source_is_gone_stale_calls_get_its_error_at_once(short_dir):
    from launchpad.nodes.cacher import _CachingForwarder  # pylint: disable=import-outside-toplevel
    server = courier.Server(address=f'unix:{short_dir}/source.sock')
    server.bind_object(Source())
    server.Start()
    try:
        forwarder = _CachingForwarder(courier.Client(server.address), 0.05, 0.1)
        assert forwarder.square(3) == 9
    finally:
        server.Stop()
    time.sleep(0.2)  # Stale now.
    started = time.monotonic()
    with pytest.raises(courier.ServerUnavailableError, match="'square'"):
        forwarder.square(3)  # The source client has neither call_timeout nor wait_for_ready=False.
    assert time.monotonic() - started < 10


def test_a_cacher_starting_before_its_source_waits_for_it(short_dir):
    from launchpad.nodes.cacher import _CachingForwarder  # pylint: disable=import-outside-toplevel
    address = f'unix:{short_dir}/source.sock'
    built = []
    thread = threading.Thread(target=lambda: built.append(_CachingForwarder(
        courier.Client(address, wait_for_ready=False), 1.0, 5.0)))
    thread.start()
    time.sleep(0.3)
    assert not built
    server = courier.Server(address=address)
    server.bind_object(Source())
    server.Start()
    try:
        thread.join(20)
        assert built and built[0].square(4) == 16
    finally:
        server.Stop()
