"""A worker that dies mid-map has its tasks re-run on the others: every result is delivered
exactly once, in order for map/imap; the pool grows and shrinks while it runs."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import courier
import launchpad as lp
from launchpad.pool import PoolWorker

pytestmark = pytest.mark.timeout(120)


def _live(pool):
    """The pool's live workers (key -> pid and host)."""
    return pool._workers()  # pylint: disable=protected-access


def slow_square(x, log_dir):
    """x*x after 20 ms; logs every run (a re-run task runs twice)."""
    with open(os.path.join(log_dir, f'{x}-{os.getpid()}-{time.monotonic_ns()}'), 'w'):
        pass
    time.sleep(0.02)
    return x * x


def dies_once(x, marker):
    """SIGKILLs its own worker process the first time it runs for x == 5."""
    if x == 5:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            os.kill(os.getpid(), signal.SIGKILL)
        except FileExistsError:
            pass
    return -x


def _runs(log_dir):
    counts = {}
    for name in os.listdir(log_dir):
        x = int(name.split('-')[0])
        counts[x] = counts.get(x, 0) + 1
    return counts


def test_a_worker_sigkilled_mid_map_has_its_tasks_rerun_and_each_result_comes_once(tmp_path):
    with lp.Pool(3, launch_type='local_mp') as pool:
        victim = next(iter(_live(pool).values()))['pid']
        started = threading.Event()

        def kill_when_busy():
            started.wait()
            while not os.listdir(tmp_path):
                time.sleep(0.005)
            os.kill(victim, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        started.set()
        results = pool.starmap(slow_square, [(x, str(tmp_path)) for x in range(120)], chunksize=2)
        killer.join()
        assert results == [x * x for x in range(120)]
        assert pool.stats['lost'] == 1 and pool.stats['requeued'] >= 1, pool.stats
        assert set(_runs(tmp_path)) == set(range(120))  # (a task may have run twice)
        # The worker came back (restarted by its node) with a new process, and works.
        deadline = time.monotonic() + 60
        while len(_live(pool)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = {w['pid'] for w in _live(pool).values()}
        assert len(pids) == 3 and victim not in pids
        assert pool.map(abs, range(-9, 0)) == list(range(9, 0, -1))


@pytest.mark.parametrize('method', ['map', 'imap', 'imap_unordered'])
def test_a_task_killing_its_worker_is_rerun_and_delivered_once(tmp_path, method):
    marker = str(tmp_path / 'died')
    with lp.Pool(2, launch_type='local_mp') as pool:
        items = [(x, marker) for x in range(40)]
        if method == 'map':
            results = pool.starmap(dies_once, items)
        else:
            results = list(getattr(pool, method)(_call_dies_once, items))
        if method == 'imap_unordered':
            results = sorted(results, reverse=True)
        assert results == [-x for x in range(40)]
        assert pool.stats['lost'] == 1 and pool.stats['requeued'] >= 1


def _call_dies_once(pair):
    return dies_once(*pair)


# --- Inside a program: handles of PoolWorkerNodes ------------------------------------------

def _pool_main(workers, marker, results_path):
    with lp.Pool(workers=workers) as pool:
        results = pool.starmap(dies_once, [(x, marker) for x in range(30)])
        deadline = time.monotonic() + 60  # the dead worker is restarted and comes back
        while len(_live(pool)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = dict(pool.stats)
    with open(results_path, 'w') as f:
        f.write(repr((results, stats)))
    lp.stop()


@pytest.mark.parametrize('launch_type', ['local_mp', 'local_mt'])
def test_a_pool_inside_a_program_survives_a_worker_death(tmp_path, launch_type):
    program = lp.Program('pool_inside')
    with program.group('pool'):
        workers = [program.add_node(lp.PoolWorkerNode()) for _ in range(2)]
    results_path = tmp_path / 'results'
    program.add_node(lp.PyNode(_pool_main, workers, str(tmp_path / 'died'), str(results_path)),
                     label='main')
    controller = lp.launch(program, launch_type=launch_type)
    assert controller.wait(timeout=90)
    results, stats = eval(results_path.read_text())  # pylint: disable=eval-used
    assert results == [-x for x in range(30)]
    assert stats['lost'] == 1 and stats['requeued'] >= 1 and stats['revived'] == 1


# --- Growing and shrinking: workers added and removed while the pool runs ------------------

class CountingWorker(PoolWorker):
    def __init__(self):
        super().__init__()
        self.executed = 0

    def execute(self, *args):
        self.executed += 1
        return super().execute(*args)


def test_workers_join_and_leave_a_running_pool(tmp_path):
    servers, counters = [], []
    for i in range(3):
        worker = CountingWorker()
        server = courier.Server(address=f'unix:{tmp_path}/{i}.sock')
        server.bind_object(worker)
        server.Start()
        servers.append(server)
        counters.append(worker)
    try:
        pool = lp.Pool(workers=[courier.Client(servers[0].address)])
        assert pool.map(abs, range(-20, 0), chunksize=1) == list(range(20, 0, -1))
        assert [c.executed for c in counters] == [20, 0, 0]
        pool._add_worker(courier.Client(servers[1].address), key='second')
        deadline = time.monotonic() + 30
        while len(_live(pool)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pool.map(time.sleep, [0.01] * 40, chunksize=1)
        assert counters[1].executed > 0  # the new worker took some of the tasks
        pool._remove_worker('second')
        before = counters[1].executed
        pool.map(abs, range(30), chunksize=1)
        assert counters[1].executed == before
        pool.close()
        pool.join()
    finally:
        for server in servers:
            server.Stop()


def test_a_stopped_worker_server_counts_as_lost_and_its_tasks_go_to_the_others(tmp_path):
    servers = []
    for i in range(2):
        server = courier.Server(address=f'unix:{tmp_path}/{i}.sock')
        server.bind_object(PoolWorker())
        server.Start()
        servers.append(server)
    _FIRST_SERVER_STOPPED.clear()
    _HELD_BY.clear()

    def stop_the_first_while_it_runs_a_task():
        # (a server stopped with no call in flight is waited for, not lost: its client waits
        # for it to serve again)
        deadline = time.monotonic() + 30
        while (not any(servers[0].address in name for name in _HELD_BY)
               and time.monotonic() < deadline):
            time.sleep(0.005)
        servers[0].Stop()
        _FIRST_SERVER_STOPPED.set()

    stopper = threading.Thread(target=stop_the_first_while_it_runs_a_task, daemon=True)
    try:
        with lp.Pool(workers=[courier.Client(s.address) for s in servers]) as pool:
            stopper.start()
            results = pool.map(_identity_held_until_a_server_stopped, range(60), chunksize=1)
            assert results == list(range(60))
            assert pool.stats['lost'] >= 1
    finally:
        _FIRST_SERVER_STOPPED.set()
        for server in servers:
            server.Stop()
        if stopper.is_alive():
            stopper.join(30)


_FIRST_SERVER_STOPPED = threading.Event()
_HELD_BY: list = []  # the names of the server threads that run a held task


def _identity_held_until_a_server_stopped(x):
    """x; from x = 30 on, once the test has stopped a worker's server: so the map still runs,
    with a task in flight on that server, when it does."""
    if x >= 30:
        _HELD_BY.append(threading.current_thread().name)
        _FIRST_SERVER_STOPPED.wait(30)
    return x


# --- An elastic group of workers: the pool follows it --------------------------------------

def _elastic_pool_main(workers, results_path):
    """Maps while the group grows 1 -> 3 -> 1 (lp.resize); the pool takes the members."""
    sizes = []
    with lp.Pool(workers=workers) as pool:
        results = [pool.map(abs, range(-10, 0))]
        for size in (3, 1):
            lp.resize('pool', size)
            deadline = time.monotonic() + 60
            while len(_live(pool)) != size and time.monotonic() < deadline:
                time.sleep(0.05)
            sizes.append(sorted(_live(pool)))
            results.append(pool.map(time.sleep, [0.01] * 20, chunksize=1))
        stats = dict(pool.stats)
    with open(results_path, 'w') as f:
        f.write(repr((results, sizes, stats)))
    lp.stop()


def test_a_pool_on_a_group_handle_follows_the_group_as_it_grows_and_shrinks(tmp_path):
    program = lp.Program('pool_elastic')
    with program.group('pool', elastic=lp.Elastic(make_node=lp.PoolWorkerNode)):
        program.add_node(lp.PoolWorkerNode())
    results_path = tmp_path / 'results'
    program.add_node(lp.PyNode(_elastic_pool_main, program.group_handle('pool'),
                               str(results_path)), label='main')
    controller = lp.launch(program, launch_type='local_mp')
    assert controller.wait(timeout=120)
    results, sizes, stats = eval(results_path.read_text())  # pylint: disable=eval-used
    assert results == [list(range(10, 0, -1)), [None] * 20, [None] * 20]
    assert sizes == [['pool/0', 'pool/1', 'pool/2'], ['pool/0']]
    assert stats['joined'] == 3, stats


# --- A pool on a group that has no member yet waits for one --------------------------------

def _pool_on_a_group_growing_from_nothing(workers, results_path):
    """Builds the pool while the group is still empty; a thread asks for one member."""
    grower = threading.Thread(target=lp.resize, args=('pool', 1))
    grower.start()
    with lp.Pool(workers=workers, start_timeout=60) as pool:
        results = pool.map(abs, range(-10, 0))
    grower.join()
    with open(results_path, 'w') as f:
        f.write(repr(results))
    lp.stop()


def _pool_on_a_group_that_stays_empty(workers, results_path):
    try:
        lp.Pool(workers=workers, start_timeout=1)
        outcome = 'returned'
    except TimeoutError as error:
        outcome = str(error)
    with open(results_path, 'w') as f:
        f.write(outcome)
    lp.stop()


def _run_on_an_empty_elastic_group(main, launch_type, tmp_path):
    program = lp.Program('pool_empty_group')
    with program.group('pool', elastic=lp.Elastic(make_node=lp.PoolWorkerNode)):
        pass  # no member at start
    results_path = tmp_path / 'results'
    program.add_node(lp.PyNode(main, program.group_handle('pool'), str(results_path)),
                     label='main')
    assert lp.launch(program, launch_type=launch_type).wait(timeout=120)
    return results_path.read_text()


@pytest.mark.parametrize('launch_type', ['local_mp', 'local_mt'])
def test_a_pool_on_a_group_with_no_member_yet_waits_for_one(tmp_path, launch_type):
    results = _run_on_an_empty_elastic_group(_pool_on_a_group_growing_from_nothing,
                                             launch_type, tmp_path)
    assert results == repr(list(range(10, 0, -1)))


@pytest.mark.parametrize('launch_type', ['local_mp', 'local_mt'])
def test_a_pool_on_a_group_that_never_gets_a_member_times_out_naming_it(tmp_path, launch_type):
    message = _run_on_an_empty_elastic_group(_pool_on_a_group_that_stays_empty, launch_type,
                                             tmp_path)
    assert "group 'pool'" in message and 'no member' in message, message
