"""Every way a courier call can fail, and what the caller sees."""

from __future__ import annotations

import concurrent.futures
import datetime
import threading
import time

import portpicker
import pytest

import courier
from tests.core.conftest import wait_until


class _Unpicklable(Exception):
    """An exception whose instances refuse to be pickled."""

    def __reduce__(self):
        raise TypeError('no pickling for you')


class _UnloadableOnClient(Exception):
    """Pickles fine, but fails to unpickle (as if the class did not exist there)."""

    def __reduce__(self):
        return _fail_to_load, ()


def _fail_to_load():
    raise ImportError('class only exists on the server')


def _raise(exception):
    raise exception


def test_remote_exception_keeps_its_type_and_carries_the_traceback(server):
    def faulty(x):
        return {'a': 1}[x]

    server.Bind('faulty', faulty)
    client = courier.Client(server.address)
    with pytest.raises(KeyError) as info:
        client.faulty('missing')
    assert info.value.args == ('missing',)
    remote = info.value.__cause__
    assert isinstance(remote, courier.errors.RemoteTraceback)
    assert 'in faulty' in str(remote) and "return {'a': 1}[x]" in str(remote)
    assert info.value.remote_traceback.strip() in str(remote)
    assert server.address in str(remote)
    assert client.add(1, 1) == 2  # The server keeps serving.


def test_remote_exception_through_a_future(server):
    server.Bind('fail', lambda: _raise(ValueError('async failure')))
    future = courier.Client(server.address).futures.fail()
    with pytest.raises(ValueError, match='async failure') as info:
        future.result(timeout=10)
    assert 'async failure' in str(info.value.__cause__)


@pytest.mark.parametrize('exception', [_Unpicklable('nope'), _UnloadableOnClient('nope')])
def test_exception_that_cannot_travel_becomes_remote_error(server, exception):
    server.Bind('fail', lambda: _raise(exception))
    client = courier.Client(server.address)
    with pytest.raises(courier.RemoteError) as info:
        client.fail()
    error = info.value
    assert error.remote_type.endswith(type(exception).__qualname__)
    assert "'fail'" in str(error) and server.address in str(error) and 'nope' in str(error)
    assert 'Remote traceback' in str(error) and '_raise' in error.remote_traceback
    assert client.add(2, 2) == 4


def test_system_exit_in_a_method_does_not_exit_the_caller(server):
    server.Bind('exit', lambda: _raise(SystemExit(3)))
    client = courier.Client(server.address)
    with pytest.raises(courier.RemoteError, match='SystemExit'):
        client.exit()
    assert client.add(1, 2) == 3


def test_unknown_method_names_method_address_and_existing_methods(server):
    client = courier.Client(server.address)
    with pytest.raises(courier.UnknownMethodError) as info:
        client.sub(1, 2)
    message = str(info.value)
    assert "'sub'" in message and server.address in message
    assert "'add'" in message and "'echo'" in message
    assert 'not found' in message  # What code written for dm-launchpad looks for.
    assert isinstance(info.value, AttributeError)
    with pytest.raises(courier.UnknownMethodError):
        client.futures.sub(1, 2).result(timeout=10)


def test_unpicklable_argument_names_method_and_type(server):
    client = courier.Client(server.address)
    with pytest.raises(courier.SerializationError) as info:
        client.echo(1, lock=threading.Lock())
    message = str(info.value)
    assert "'echo'" in message and '_thread.lock' in message and "kwargs['lock']" in message
    future = client.futures.echo(threading.Lock())
    with pytest.raises(courier.SerializationError, match='_thread.lock'):
        future.result(timeout=10)


def test_unpicklable_result_names_method_and_type(server):
    server.Bind('lock', threading.Lock)
    client = courier.Client(server.address)
    with pytest.raises(courier.SerializationError) as info:
        client.lock()
    assert "result of 'lock'" in str(info.value) and '_thread.lock' in str(info.value)
    assert client.add(1, 2) == 3


class _ServerCannotLoad:
    def __reduce__(self):
        return _fail_to_load, ()


def test_argument_the_server_cannot_unpickle(server):
    client = courier.Client(server.address)
    with pytest.raises(courier.SerializationError) as info:
        client.echo(_ServerCannotLoad())
    assert "arguments of 'echo'" in str(info.value) and 'only exists on the server' in str(
        info.value)


@pytest.mark.parametrize('timeout', [0.2, datetime.timedelta(milliseconds=200)])
def test_call_timeout_names_method_and_address(server, timeout):
    client = courier.Client(server.address, call_timeout=timeout)
    with pytest.raises(courier.CallTimeoutError) as info:
        client.sleep(5)
    assert isinstance(info.value, TimeoutError)
    assert not isinstance(info.value, courier.ServerUnavailableError)
    assert "'sleep'" in str(info.value) and server.address in str(info.value)
    assert 'Deadline Exceeded' in str(info.value)  # What code written for dm-launchpad looks for.
    with pytest.raises(TimeoutError, match='Deadline Exceeded'):
        client.futures.sleep(5).result(timeout=10)
    assert client.add(1, 1) == 2


def test_bad_call_timeout_is_refused():
    with pytest.raises(ValueError, match='call_timeout'):
        courier.Client('localhost:1', call_timeout=-1)
    with pytest.raises(TypeError, match='call_timeout'):
        courier.Client('localhost:1', call_timeout='5s')


def _free_address() -> str:
    return f'127.0.0.1:{portpicker.pick_unused_port()}'


def test_server_down_without_wait_for_ready_fails_at_once():
    client = courier.Client(_free_address(), call_timeout=30, wait_for_ready=False)
    start = time.monotonic()
    with pytest.raises(courier.ServerUnavailableError) as info:
        client.anything()
    assert time.monotonic() - start < 10
    assert isinstance(info.value, ConnectionError)
    assert 'wait_for_ready=True' in str(info.value) and "'anything'" in str(info.value)


def test_server_down_with_wait_for_ready_waits_for_the_deadline():
    address = _free_address()
    client = courier.Client(address, call_timeout=0.5, wait_for_ready=True)
    start = time.monotonic()
    with pytest.raises(courier.ServerUnreachableTimeoutError) as info:
        client.anything()
    assert time.monotonic() - start >= 0.45
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, ConnectionError)
    assert 'not reachable' in str(info.value) and address in str(info.value)


def test_wait_for_ready_call_succeeds_once_the_server_comes_up(make_server):
    address = _free_address()
    client = courier.Client(address, call_timeout=20)
    future = client.futures.hello()
    time.sleep(0.3)
    assert not future.done()
    server = make_server(address=address)
    server.Bind('hello', lambda: 'hi')
    server.Start()
    assert future.result(timeout=20) == 'hi'


def test_cancelled_future_cancels_the_call(make_server):
    """A cancelled call waiting for its server never runs once the server is up."""
    address = _free_address()
    client = courier.Client(address)
    future = client.futures.record('cancelled')
    time.sleep(0.2)
    assert future.cancel()
    assert future.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        future.result()
    recorded = []
    server = make_server(address=address)
    server.Bind('record', recorded.append)
    server.Start()
    assert client.record('after') is None
    time.sleep(0.2)
    assert recorded == ['after']


def test_cancelling_a_running_call_leaves_server_serving(server):
    client = courier.Client(server.address)
    future = client.futures.sleep(0.3)
    time.sleep(0.05)
    assert future.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        future.result()
    assert not future.cancel() or future.cancelled()
    assert client.add(3, 4) == 7


@pytest.mark.parametrize('transport_kind', ['tcp', 'grpc', 'unix', 'in_process'],
                         indirect=True)
def test_calls_cancelled_while_waiting_for_a_worker_never_run(make_server, transport_kind,
                                                              socket_dir):
    """The server hears of a cancelled call: one still queued for a busy pool never runs."""
    address = (f'unix:{socket_dir}/s.sock' if transport_kind in ('unix', 'in_process')
               else None)
    server = make_server(address=address, thread_pool_size=2)
    release, blocked, ran = threading.Event(), threading.Semaphore(0), []
    server.Bind('block', lambda: blocked.release() or release.wait(30))
    server.Bind('record', lambda value, padding=b'': ran.append(value))
    server.Start()
    client = courier.Client(server.address, call_timeout=60)
    try:
        blockers = [client.futures.block() for _ in range(2)]
        for _ in blockers:  # Every worker is busy now.
            assert blocked.acquire(timeout=30)
        # Far more bytes than one read of the server takes: their cancellations come later.
        cancelled = [client.futures.record(i, bytes(4096)) for i in range(100)]
        assert all(future.cancel() for future in cancelled)
        _until_the_server_heard_the_cancels(server, transport_kind, len(cancelled))
    finally:
        release.set()
    assert all(blocker.result(timeout=30) for blocker in blockers)
    assert client.futures.record('after').result(timeout=30) is None  # Queued after them.
    assert ran == ['after']


def _until_the_server_heard_the_cancels(server, transport_kind: str, count: int) -> None:
    """Waits until the server has read ``count`` cancellations of calls it has not started."""
    if transport_kind == 'in_process':
        return  # Cancelling the future is all there is.
    if transport_kind == 'grpc':
        time.sleep(1.0)  # gRPC's own threads take the cancellations, which nothing here shows.
        return

    def cancelled() -> int:  # pylint: disable=protected-access
        connections = server._transport._framed._loop.connections() if transport_kind == 'tcp' \
            else server._transport._loop.connections()
        return sum(1 for connection in connections for entry in connection.calls.values()
                   if entry[1])
    # Read by the server while every worker is busy (a worker that reads them only once it is
    # free would race the other workers, which may start a cancelled call first).
    assert wait_until(lambda: cancelled() >= count, timeout=10), f'{cancelled()} of {count}'


def test_cancelled_futures_count_as_done_for_concurrent_futures(server):
    client = courier.Client(server.address)
    running, waiting = client.futures.sleep(2), client.futures.sleep(2)
    assert running.cancel() and waiting.cancel()
    done, not_done = concurrent.futures.wait([running, waiting], timeout=10)
    assert done == {running, waiting} and not not_done
    assert list(concurrent.futures.as_completed([running], timeout=10)) == [running]
    assert running.cancel()  # Cancelling again is harmless.


def test_a_calls_future_works_with_everything_concurrent_futures_offers(server):
    """A call's future makes its own attributes (a cheaper condition than Future's): none of
    concurrent.futures.Future's is missing, and waiting, callbacks and timeouts work."""
    client = courier.Client(server.address)
    slow, fast = client.futures.sleep(0.5), client.futures.add(1, 2)
    assert set(vars(concurrent.futures.Future())) <= set(vars(slow))
    seen = []
    slow.add_done_callback(seen.append)
    with pytest.raises(concurrent.futures.TimeoutError):
        slow.result(timeout=0.01)
    done, _ = concurrent.futures.wait([slow, fast], return_when=concurrent.futures.FIRST_COMPLETED,
                                      timeout=30)
    assert fast in done
    assert set(concurrent.futures.as_completed([slow, fast], timeout=30)) == {slow, fast}
    assert slow.result(timeout=30) == 'slept' and fast.result() == 3
    assert seen == [slow]
    failing = client.futures.add(1, 'one')
    with pytest.raises(TypeError):
        failing.result(timeout=30)
    assert isinstance(failing.exception(), TypeError)


def test_done_future_cannot_be_cancelled(server):
    future = courier.Client(server.address).futures.add(1, 2)
    assert future.result(timeout=10) == 3
    assert not future.cancel()


def test_server_stopping_during_a_call(make_server):
    server = make_server()
    server.Bind('sleep', time.sleep)
    server.Start()
    client = courier.Client(server.address)
    future = client.futures.sleep(2)
    time.sleep(0.2)
    server.Stop()
    with pytest.raises(courier.ServerUnavailableError):
        future.result(timeout=10)


def test_not_a_courier_server(make_server):
    import grpc  # pylint: disable=import-outside-toplevel
    other = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
    port = other.add_insecure_port('127.0.0.1:0')
    other.start()
    try:
        client = courier.Client(f'127.0.0.1:{port}', call_timeout=10)
        with pytest.raises(courier.ProtocolError, match='does not serve the courier protocol'):
            client.anything()
    finally:
        other.stop(None).wait()


def test_address_callable_that_fails_is_retried():
    attempts = []

    def address():
        attempts.append(1)
        if len(attempts) == 1:
            raise LookupError('not registered yet')
        return 42

    client = courier.Client(address)
    with pytest.raises(LookupError):
        client.f()
    with pytest.raises(TypeError, match='returned int'):
        client.f()
    assert len(attempts) == 2


def test_malformed_client_arguments():
    client = courier.Client('no-port')  # resolved at the first call, as in dm-launchpad
    with pytest.raises(ValueError, match="'no-port' is not 'host:port'.*no name service"):
        client.f()
    with pytest.raises(ValueError, match="'no-port' is not 'host:port'"):
        client.futures.f().result()
    with pytest.raises(TypeError, match='address must be'):
        courier.Client(1234)
    with pytest.raises(TypeError, match='needs a courier.Client'):
        courier.list_methods('localhost:1')


def test_async_method_fails_clearly(server):
    async def coroutine_function():
        return 1

    server.Bind('async_method', coroutine_function)
    client = courier.Client(server.address)
    with pytest.raises(TypeError, match='returned a coroutine'):
        client.async_method()
    assert client.add(1, 1) == 2


@pytest.mark.parametrize('method', ['x\udcff', 'y' * (2 << 20)], ids=['not_unicode', 'too_long'])
def test_a_method_name_that_cannot_travel_is_a_clear_error(server, method):
    client = courier.Client(server.address, call_timeout=10)
    for call in (lambda: getattr(client, method)(),
                 lambda: getattr(client.futures, method)().result(timeout=10)):
        with pytest.raises(courier.SerializationError, match='method name') as info:
            call()
        assert server.address in str(info.value) and repr(method[:10])[:-1] in str(info.value)
    assert client.add(1, 2) == 3
