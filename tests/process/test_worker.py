"""The worker (`launchpad.process.worker`), run as a node process against a coordinator served
here: what it tells the coordinator however its threads race."""
import concurrent.futures
import functools
import socket
import subprocess
import sys
import threading
import time

import courier
import pytest

import launchpad as lp
from launchpad import runtime
from launchpad.address import Address

from launchpad.address import AddressTable
from launchpad.process import spec as specs
from launchpad.process.coordinator import Coordinator, serve_coordinator
from launchpad.process.states import NodeState
from launchpad.process.supervisor_endpoint import SupervisorEndpoint, SupervisorGoneError

from tests.core.conftest import script_env, wait_until
from tests.courier.conftest import FreezableRelay

TOKEN = 'worker-test-token'


class SlowInMainThread:
    """A coordinator address that the worker's main thread, which reports the node's start,
    resolves only after `delay` seconds; its other threads at once (picklable)."""

    def __init__(self, address, delay):
        self.address, self.delay = address, delay

    def __call__(self):
        if threading.current_thread() is threading.main_thread():
            time.sleep(self.delay)
        return self.address


def never_called():
    raise AssertionError('a node started into a stopping program does not run')


def publish_and_serve(address):
    runtime.get_context().address_table.publish(address, '10.0.0.1:1234')
    lp.wait_for_stop()


def start_worker(tmp_path, coordinator_address, name, run, table=None, grace=None):
    """Starts node `name` (`run`) in a worker process (`grace`: a detached program's)."""
    packer = specs.Packer('worker-test', 'local_mp', table or AddressTable(), coordinator_address,
                          notice_period=1.0, coordinator_grace=grace)
    path = str(tmp_path / f'{name.replace("/", "_")}.spec')
    specs.write(packer.spec(name, run), path)
    return subprocess.Popen(specs.worker_argv(path), env=script_env(
        {courier.AUTH_TOKEN_ENV: TOKEN}))


def run_worker(tmp_path, coordinator_address, name, run, timeout=60):
    """Runs node `name` (`run`) in a worker process; returns (its exit code, its pid)."""
    process = start_worker(tmp_path, coordinator_address, name, run)
    try:
        return process.wait(timeout=timeout), process.pid
    finally:
        process.kill()


def test_a_node_started_into_a_stopping_program_reports_its_start_before_it_ends(tmp_path):
    """Its stop watcher sees the stop before its main thread reported the start (a slow first
    connection on a loaded machine): the node ends at once, and the coordinator still knows
    where it ran. It used to report only its end, leaving the node FINISHED with no host."""
    coordinator = Coordinator(['actor/1'])
    coordinator.request_stop('the learner had enough updates')
    server = serve_coordinator(coordinator, f'unix:{tmp_path}/coordinator.sock',
                               auth_token=TOKEN)
    try:
        code, pid = run_worker(tmp_path, SlowInMainThread(server.address, 3.0), 'actor/1',
                               never_called)
    finally:
        server.Stop()
    status = coordinator.status()['actor/1']
    assert code == 0
    assert (status.state, status.host, status.pid) == (
        NodeState.FINISHED, socket.gethostname(), pid), status


def test_a_call_in_flight_when_the_supervisor_dies_goes_to_the_next_one(tmp_path):
    """A detached program's node calls its coordinator through a `SupervisorEndpoint`: a call
    in flight when the supervisor's server goes away is sent again once a new one serves at the
    same endpoint; with none within the grace, a call fails saying so."""
    endpoint = f'unix:{tmp_path}/coordinator.sock'
    coordinator = Coordinator(['worker/0'])
    server = serve_coordinator(coordinator, endpoint, auth_token=TOKEN)
    client = courier.Client(SupervisorEndpoint(endpoint, grace=30.0), call_timeout=30.0,
                            wait_for_ready=False, auth_token=TOKEN)
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(
        client.lookup_address, 'learner', 20.0)
    time.sleep(1.0)  # (the lookup waits at the first server)
    server.Stop()
    time.sleep(1.0)
    server = serve_coordinator(coordinator, endpoint, auth_token=TOKEN)  # the next supervisor
    try:
        coordinator.publish_address('learner', '10.0.0.1:1234')
        assert waiting.result(timeout=30) == '10.0.0.1:1234'
    finally:
        server.Stop()
    gone = courier.Client(SupervisorEndpoint(endpoint, grace=0.5), call_timeout=30.0,
                          wait_for_ready=False, auth_token=TOKEN)
    with pytest.raises(SupervisorGoneError, match='within the supervisor grace of 0.5 s'):
        gone.lookup_address('learner', 0.0)


def test_a_new_supervisor_hears_again_what_a_detached_node_published(tmp_path):
    """The supervisor that heard a node's start and published endpoint dies before it persisted
    them; the next one (a coordinator without them, at the same endpoint) hears both again from
    the node, whose calls to it went on."""
    endpoint = f'unix:{tmp_path}/coordinator.sock'
    address = Address('server')
    table = AddressTable(published={address.id: '127.0.0.1:0'})
    first = Coordinator(['server/0'])
    server = serve_coordinator(first, endpoint, auth_token=TOKEN)
    process = start_worker(tmp_path, endpoint, 'server/0',
                           functools.partial(publish_and_serve, address), table, grace=30.0)
    try:
        assert wait_until(lambda: first.lookup_address(address.id, 0.0), timeout=60)
        server.Stop()
        second = Coordinator(['server/0'])  # (persisted before the node started)
        server = serve_coordinator(second, endpoint, auth_token=TOKEN)
        assert wait_until(lambda: second.lookup_address(address.id, 0.0) == '10.0.0.1:1234',
                          timeout=30)
        assert second.status()['server/0'].pid == process.pid
        second.request_stop('done')
        assert process.wait(timeout=30) == 0
        assert second.status()['server/0'].state is NodeState.FINISHED
    finally:
        process.kill()
        server.Stop()


def test_a_stop_watchers_poll_that_times_out_dials_again(tmp_path):
    """A supervisor gone without a word (its pod deleted, its host cut off) leaves the stop
    watcher's connection open and silent, while its successor listens under the same name
    elsewhere (a new pod's address). A poll that times out drops the connection: the next one
    dials again and reaches the successor (before, each poll timed out on the dead one, and a
    stop was not heard: the node was killed at the end of its notice)."""
    from launchpad.process import worker  # pylint: disable=import-outside-toplevel
    silent = socket.socket()
    silent.bind(('127.0.0.1', 0))
    silent.listen()  # connections are accepted (by the kernel) and never answered
    endpoint = f'unix:{tmp_path}/coordinator.sock'
    coordinator = Coordinator(['worker/0'])
    server = serve_coordinator(coordinator, endpoint, auth_token=TOKEN)
    resolved = iter([f'127.0.0.1:{silent.getsockname()[1]}', endpoint])
    watching = worker._Watching(lambda: courier.Client(  # pylint: disable=protected-access
        next(resolved), call_timeout=5.0, wait_for_ready=False, auth_token=TOKEN))
    # (5 s: the call to the successor, in this busy process, must not time out too)
    try:
        with pytest.raises(courier.CallTimeoutError):
            watching.wait_for_stop(0.1, 'worker/0')
        coordinator.request_stop()
        assert watching.wait_for_stop(0.1, 'worker/0')
    finally:
        server.Stop()
        silent.close()


def test_a_report_hung_on_a_silent_supervisor_goes_to_its_successor_once_the_watcher_dials_again(
        tmp_path):
    """The node's connections to a supervisor gone without a word stay open and silent: how the
    node ended, reported at a stop on such a connection, waited out its call timeout (10 s,
    past the notice period) and failed, so the node's pod was deleted instead of ending on its
    own. Once the stop watcher's poll times out and it dials again, the node's other clients of
    the coordinator drop their connections too: the report goes again, to the successor."""
    from launchpad.process import worker  # pylint: disable=import-outside-toplevel
    old, successor = Coordinator(['worker/0']), Coordinator(['worker/0'])
    servers = [serve_coordinator(old, f'unix:{tmp_path}/old.sock', auth_token=TOKEN),
               serve_coordinator(successor, f'unix:{tmp_path}/new.sock', auth_token=TOKEN)]
    relay = FreezableRelay(f'{tmp_path}/old.sock')
    where = [relay.address]  # the supervisor's name, as the node resolves it now
    reports = courier.Client(SupervisorEndpoint(lambda: where[0], grace=30.0),
                             call_timeout=worker._REPORT_WAIT,  # pylint: disable=protected-access
                             auth_token=TOKEN)
    watching = worker._Watching(lambda: courier.Client(  # pylint: disable=protected-access
        lambda: where[0], call_timeout=5.0, wait_for_ready=False, auth_token=TOKEN), [reports])
    reporting = concurrent.futures.ThreadPoolExecutor(1)  # (its thread's connection)
    try:
        reporting.submit(reports.node_started, 'worker/0', 10, 'host', 'i1').result(timeout=30)
        assert not watching.wait_for_stop(0.1, 'worker/0')
        relay.freeze()  # the supervisor's pod is lost; the next one serves under the name
        where[0] = servers[1].address
        successor.node_started('worker/0', 10, 'host', 'i1')  # (the node, heard again)
        finished = reporting.submit(reports.node_finished, 'worker/0')
        with pytest.raises(courier.CallTimeoutError):
            watching.wait_for_stop(0.1, 'worker/0')
        assert finished.result(timeout=30) is None
        assert successor.status()['worker/0'].state is NodeState.FINISHED
    finally:
        reports.close()
        relay.close()
        for server in servers:
            server.Stop()
