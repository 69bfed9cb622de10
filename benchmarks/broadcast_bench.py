"""Weight broadcast on one host, ours beside Ray in the same run, and large echoes.

Broadcast: a learner process holds float32 parameters of N MiB; each round it makes new
ones (the same arithmetic for every system) and 8 actor processes fetch them and read one
value of every 4 KiB page (so every page is mapped or copied, as an actor using them would).

- ours: the learner is a courier server on a Unix socket with ``update()`` and
  ``get_params()`` (read-only arrays: one placement in shared memory per update, see
  docs/courier.md); each actor is a courier server whose ``fetch()`` calls
  ``learner.get_params()``. The driver calls ``update`` then every actor's ``fetch``.
- ours-shared-array: the same, with the learner making each update's parameters in a
  ``courier.shared_array`` (sent as its own pages: no private copy, no copy per update).
- ray: the learner actor ``ray.put``s its new parameters once per update; each actor asks it
  for the reference and ``ray.get``s it (zero-copy from Ray's object store). Runs under
  ``LAUNCHPAD_BENCH_RAY_PYTHON`` (benchmarks/README.md) in a private Ray instance.

Reported per system and size: rounds/s; the learner process's CPU seconds (user + system)
per round; the peak proportional set size (PSS: shared pages counted once) of every process
of the system together, in MiB and above its size before the first fetch, and of the actors
alone above their size before the first fetch (sampled between rounds, when all hold the
same parameters), both as multiples of one copy of the parameters. The host's is also given
as sampled between rounds: the peak is taken during rounds, one process after another, and
where actors map and drop pages during a round (huge pages, docs/courier.md) a page can count
in two processes' PSS samples at once.

Echo: a float32 array sent to a courier server process on a Unix socket and returned (MB/s
of array bytes per round trip, as courier_bench.py counts), with shared memory on and off
(``COURIER_SHARED_MEMORY=0`` in the server's environment: buffers then cross the socket).

Between hosts (``--systems hosts hosts-relay hosts-relay-tcp``; brings up the SSH test bed,
tests/testbeds, as root): the learner runs on host lp-h1 and the actors on lp-h2 and lp-h3, half on each,
started over ssh. ``hosts``: every actor fetches from the learner over TCP (a copy per
actor crosses the links); ``hosts-relay``: one relay per host (lp.CacherNode's forwarder,
refreshing on every call) fetches from the learner over TCP, and its host's actors fetch
from it over a Unix socket, so in shared memory. Also reported: the learner's sends per
round (copies that left its host). ``hosts-relay-tcp``: the same relays on their host's
address, as nodes of a multi-host launch reach each other: the actors' clients find the relay
on their host and go on on its Unix socket (the same-host upgrade, docs/courier.md), so in
shared memory too. ``--without-upgrade-too`` runs each of these systems a second time, right
after, with ``COURIER_SAME_HOST=0`` in the environment of the bed's processes (row ``...
no-upgrade``): their clients then stay on TCP on one host, as before the upgrade (a copy per
actor over loopback). Between hosts the
host memory counts the relays too (their copy of the parameters, and the pages they share).

Usage: python benchmarks/broadcast_bench.py [--sizes-mib 1 64 256] [--actors 8]
           [--seconds 5] [--echo-mib 64 1024] [--systems ours ray hosts ...]
           [--without-upgrade-too] [--json out.json]
Numbers move with the machine's load: compare the columns of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import psutil

_PAGE_FLOATS = 1024  # float32 values per 4 KiB page.


def _new_params(base: np.ndarray, version: int, shared: bool = False) -> np.ndarray:
    """The parameters of an update: in private memory, or in a ``courier.shared_array``."""
    if shared:
        import courier  # pylint: disable=import-outside-toplevel
        params = np.add(base, np.float32(version), out=courier.shared_array(base.shape,
                                                                             base.dtype))
    else:
        params = np.add(base, np.float32(version))
    params.setflags(write=False)
    return params


def _touch(params: np.ndarray) -> float:
    return float(params[::_PAGE_FLOATS].sum())


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


class _PeakMemory:
    """Samples the summed PSS of a set of processes in a thread; keeps the peak."""

    def __init__(self, pids: List[int]):
        self.pids = pids
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self, pids: List[int] = None) -> int:
        total = 0
        for pid in pids or self.pids:
            try:
                total += psutil.Process(pid).memory_full_info().pss
            except psutil.Error:
                pass
        return total

    def _run(self):
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, self.sample())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.sample())


# ----- ours ------------------------------------------------------------------------------------

class _Learner:
    def __init__(self, mib: int, shared: bool = False):
        self._base = np.random.default_rng(0).random(mib * 2**20 // 4, dtype=np.float32)
        self._version = 0
        self._shared = shared
        self.params = _new_params(self._base, 0, shared)
        self.served = 0

    def update(self) -> int:
        self._version += 1
        self.params = None  # Its memory may serve the next parameters once readers let go.
        self.params = _new_params(self._base, self._version, self._shared)
        return self._version

    def get_params(self) -> np.ndarray:
        self.served += 1
        return self.params

    def cpu(self) -> float:
        return _cpu_seconds()

    def served_count(self) -> int:
        return self.served


class _Actor:
    def __init__(self, learner_address: str):
        import courier  # pylint: disable=import-outside-toplevel
        self._learner = courier.Client(learner_address, call_timeout=600)
        self.params = None

    def fetch(self) -> float:
        self.params = None  # What an actor holds: the latest parameters only.
        self.params = self._learner.get_params()
        return _touch(self.params)


def _serve(make: Any, args: tuple, address: str, ready: Any, stop: Any) -> None:
    import courier  # pylint: disable=import-outside-toplevel
    server = courier.Server(address=address, thread_pool_size=16)
    server.bind_object(make(*args))
    server.Bind('pid', os.getpid)
    server.Start()
    ready.put(server.address)
    stop.wait()
    server.Stop()


@contextlib.contextmanager
def _processes(specs: List[tuple], shared_memory: bool = True) -> Iterator[List[str]]:
    """Runs a courier server per ``(make, args, address)`` in its own process."""
    context = multiprocessing.get_context('spawn')
    stop = context.Event()
    started = []
    saved = os.environ.get('COURIER_SHARED_MEMORY')
    os.environ['COURIER_SHARED_MEMORY'] = '1' if shared_memory else '0'
    try:
        for make, args, address in specs:
            ready = context.Queue()
            process = context.Process(target=_serve, args=(make, args, address, ready, stop),
                                      daemon=True)
            process.start()
            started.append((process, ready))
        yield [ready.get(timeout=120) for _, ready in started]
    finally:
        if saved is None:
            os.environ.pop('COURIER_SHARED_MEMORY', None)
        else:
            os.environ['COURIER_SHARED_MEMORY'] = saved
        stop.set()
        for process, _ in started:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()


def broadcast_ours(mib: int, actors: int, seconds: float, shared_memory: bool = True,
                   shared_array: bool = False) -> Dict[str, float]:
    import courier  # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory(prefix='bcast-') as scratch:
        learner_address = f'unix:{scratch}/learner'
        specs = [(_Learner, (mib, shared_array), learner_address)]
        specs += [(_Actor, (learner_address,), f'unix:{scratch}/actor{i}') for i in range(actors)]
        with _processes(specs, shared_memory) as addresses:
            clients = [courier.Client(address, call_timeout=600) for address in addresses]
            learner, workers = clients[0], clients[1:]

            most_segments = [0]

            def one_round():
                learner.update()
                for future in [worker.futures.fetch() for worker in workers]:
                    future.result()
                most_segments[0] = max(most_segments[0], _segments_mapped(pids[0]))

            pids = [client.pid() for client in clients]
            results = _measure_rounds(one_round, learner.cpu, pids, pids[1:], mib, seconds)
            results['learner_segments'] = most_segments[0]
            return results


def _segments_mapped(pid: int) -> int:
    """How many segments of shared memory (courier's memfds) process ``pid`` maps."""
    with open(f'/proc/{pid}/maps') as maps:
        return len({line.split()[4] for line in maps if '/memfd:courier' in line})


def _measure_rounds(one_round, learner_cpu, host_pids, actor_pids, mib, seconds):
    memory = _PeakMemory(host_pids)
    host_before = memory.sample()
    actors_before = memory.sample(actor_pids)
    actors_peak = [0]
    host_settled = [0]

    def sample_actors():  # Also the host's, settled: no process maps or drops pages meanwhile.
        actors_peak[0] = max(actors_peak[0], memory.sample(actor_pids))
        host_settled[0] = max(host_settled[0], memory.sample())

    one_round()  # Warm up.
    sample_actors()
    with memory:
        cpu_start = learner_cpu()
        rounds = 0
        start = time.perf_counter()
        while True:
            one_round()
            rounds += 1
            if rounds % 8 == 1:
                sample_actors()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds and rounds >= 3:
                break
        cpu = learner_cpu() - cpu_start
    sample_actors()
    size = mib * 2**20
    return {'rounds': rounds, 'rounds_per_s': rounds / elapsed,
            'learner_cpu_ms_per_round': 1e3 * cpu / rounds,
            'host_pss_peak_mib': memory.peak / 2**20,
            'host_pss_growth_copies': (memory.peak - host_before) / size,
            'host_pss_settled_growth_copies': (host_settled[0] - host_before) / size,
            'actors_pss_growth_copies': (actors_peak[0] - actors_before) / size}


# ----- between hosts (the SSH test bed) -------------------------------------------------------

def _relay(source_address: str) -> Any:
    """A per-host relay: lp.CacherNode's forwarder, refreshing on every call (concurrent calls
    share one fetch), so that actors always get the learner's latest parameters."""
    import courier  # pylint: disable=import-outside-toplevel
    from launchpad.nodes import cacher  # pylint: disable=import-outside-toplevel
    return cacher._CachingForwarder(  # pylint: disable=protected-access
        courier.Client(source_address, call_timeout=600), 0.0, 0.0)


# Systems across the SSH bed's hosts, and how actors reach a relay on their host (None: none).
_HOSTS = {'hosts': None, 'hosts-relay': 'unix', 'hosts-relay-tcp': 'tcp'}
_ROLES = {'learner': lambda mib, source: _Learner(mib),
          'actor': lambda mib, source: _Actor(source),
          'relay': lambda mib, source: _relay(source)}


def serve_role(role: str, listen: str, mib: int, source: str) -> None:
    """Serves one role on a host of the bed until its standard input closes (the driver's ssh
    ended): prints the server's address first."""
    import courier  # pylint: disable=import-outside-toplevel
    server = courier.Server(address=listen, thread_pool_size=16)
    server.bind_object(_ROLES[role](mib, source))
    server.Bind('pid', os.getpid)
    server.Start()
    print(f'ADDRESS {server.address}', flush=True)
    sys.stdin.read()
    server.Stop()


class _Remote:
    """Processes started over ssh on the bed's hosts, each ended when its ssh's stdin closes."""

    def __init__(self, same_host: bool = True):
        self.processes: List[subprocess.Popen] = []
        self._environment = '' if same_host else 'COURIER_SAME_HOST=0 '

    def start(self, host: Any, role: str, listen: str, mib: int, source: str = '') -> str:
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        command = (f'cd {repo} && {self._environment}PYTHONPATH={repo} exec {host.python} -u '
                   f'benchmarks/'
                   f'broadcast_bench.py --role {role} --listen {listen} --sizes-mib {mib} '
                   f'--source "{source}"')
        process = subprocess.Popen(host.ssh_command(command), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        self.processes.append(process)
        line = process.stdout.readline()
        if not line.startswith('ADDRESS '):
            raise RuntimeError(f'{role} on {host.name} did not start: {line!r}')
        return line.split()[1]

    def end_all(self) -> None:
        import cpu_per_call  # pylint: disable=import-outside-toplevel  (benchmarks/)
        cpu_per_call.end_all(self.processes, timeout=20)


def broadcast_hosts(hosts: List[Any], mib: int, actors: int, seconds: float,
                    relay: Optional[str], same_host: bool = True) -> Dict[str, float]:
    """The learner on the first host, the actors on the other two (half each) fetching over
    TCP, or through a relay on their own host: on a Unix socket (so in shared memory) with
    ``relay='unix'``, on the host's address (as nodes of a multi-host launch reach each
    other) with ``relay='tcp'``; ``same_host=False``: the bed's processes run with
    COURIER_SAME_HOST=0."""
    import courier  # pylint: disable=import-outside-toplevel
    remote = _Remote(same_host)
    try:
        with tempfile.TemporaryDirectory(prefix='bcast-hosts-') as scratch:
            learner_address = remote.start(hosts[0], 'learner', f'{hosts[0].ip}:0', mib)
            actor_addresses, relay_addresses = [], []
            for index, host in enumerate(hosts[1:3]):
                source = learner_address
                if relay:
                    listen = f'unix:{scratch}/relay{index}' if relay == 'unix' else f'{host.ip}:0'
                    source = remote.start(host, 'relay', listen, mib, learner_address)
                    relay_addresses.append(source)
                actor_addresses += [remote.start(host, 'actor', f'{host.ip}:0', mib, source)
                                    for _ in range(actors // 2 + (index < actors % 2))]
            learner = courier.Client(learner_address, call_timeout=600)
            workers = [courier.Client(address, call_timeout=600) for address in actor_addresses]

            def one_round():
                learner.update()
                for future in [worker.futures.fetch() for worker in workers]:
                    future.result()

            pids = [client.pid() for client in [learner, *workers]]
            relays = [courier.Client(address).pid() for address in relay_addresses]
            served = learner.served_count()
            results = _measure_rounds(one_round, learner.cpu, pids + relays, pids[1:], mib,
                                      seconds)
            results['learner_sends_per_round'] = ((learner.served_count() - served)
                                                  / (results['rounds'] + 1))  # And the warm-up.
            return results
    finally:
        remote.end_all()


# ----- Ray (run under its own interpreter) ------------------------------------------------------

def broadcast_ray(mib: int, actors: int, seconds: float) -> Dict[str, float]:
    import ray  # pylint: disable=import-outside-toplevel

    @ray.remote(num_cpus=0)
    class Learner:
        def __init__(self, mib):
            self._base = np.random.default_rng(0).random(mib * 2**20 // 4, dtype=np.float32)
            self._version = 0
            self._ref = ray.put(_new_params(self._base, 0))

        def update(self):
            self._version += 1
            self._ref = ray.put(_new_params(self._base, self._version))
            return self._version

        def get_params_ref(self):
            return [self._ref]  # In a list: the reference itself, not its value.

        def cpu(self):
            return _cpu_seconds()

        def pid(self):
            return os.getpid()

    @ray.remote(num_cpus=0)
    class Actor:
        def __init__(self, learner):
            self._learner = learner
            self.params = None

        def fetch(self):
            self.params = None
            ref = ray.get(self._learner.get_params_ref.remote())[0]
            self.params = ray.get(ref)
            return _touch(self.params)

        def pid(self):
            return os.getpid()

    ray.init(include_dashboard=False, num_cpus=2, log_to_driver=False,
             object_store_memory=max(1 << 30, 8 * mib * 2**20))
    try:
        learner = Learner.remote(mib)
        workers = [Actor.remote(learner) for _ in range(actors)]

        def one_round():
            ray.get(learner.update.remote())
            ray.get([worker.fetch.remote() for worker in workers])

        actor_pids = ray.get([worker.pid.remote() for worker in workers])
        host_pids = [child.pid for child in psutil.Process().children(recursive=True)]
        return _measure_rounds(one_round, lambda: ray.get(learner.cpu.remote()), host_pids,
                               actor_pids, mib, seconds)
    finally:
        ray.shutdown()


def _run_ray(sizes: List[int], actors: int, seconds: float) -> Dict[int, Any]:
    python = os.environ.get('LAUNCHPAD_BENCH_RAY_PYTHON')
    if not python:
        return {size: 'skipped: LAUNCHPAD_BENCH_RAY_PYTHON is not set' for size in sizes}
    results = {}
    for size in sizes:
        command = [python, os.path.abspath(__file__), '--ray-only', '--sizes-mib', str(size),
                   '--actors', str(actors), '--seconds', str(seconds)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        try:
            results[size] = json.loads(done.stdout.strip().splitlines()[-1])[str(size)]
        except (IndexError, ValueError, KeyError):
            results[size] = f'failed: {done.stderr[-2000:]}'
    return results


# ----- echo ------------------------------------------------------------------------------------

class _Echo:
    def echo(self, value):
        return value


def echo(mib: int, shared_memory: bool, seconds: float) -> Dict[str, float]:
    import courier  # pylint: disable=import-outside-toplevel
    with tempfile.TemporaryDirectory(prefix='echo-') as scratch:
        with _processes([(_Echo, (), f'unix:{scratch}/echo')], shared_memory) as (address,):
            client = courier.Client(address, call_timeout=600)
            array = np.random.default_rng(0).random(mib * 2**20 // 4, dtype=np.float32)
            client.echo(array)  # Warm up.
            calls = 0
            start = time.perf_counter()
            while True:
                result = client.echo(array)
                calls += 1
                elapsed = time.perf_counter() - start
                if elapsed >= seconds and calls >= 3:
                    break
            assert result.shape == array.shape and result[-1] == array[-1]
            client.close()
            return {'mb_per_s': array.nbytes * calls / elapsed / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--sizes-mib', nargs='+', type=int, default=[1, 64, 256])
    parser.add_argument('--actors', type=int, default=8)
    parser.add_argument('--seconds', type=float, default=5.0)
    parser.add_argument('--echo-mib', nargs='*', type=int, default=[64, 1024])
    parser.add_argument('--systems', nargs='+', choices=['ours', 'ours-shared-array', 'ours-socket', 'ray',
                                                      *_HOSTS],
                        default=['ours', 'ours-shared-array', 'ours-socket', 'ray'])
    parser.add_argument('--ray-only', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--role', choices=sorted(_ROLES), help=argparse.SUPPRESS)
    parser.add_argument('--listen', help=argparse.SUPPRESS)
    parser.add_argument('--source', help=argparse.SUPPRESS)
    parser.add_argument('--without-upgrade-too', action='store_true',
                        help='between hosts, run each system again with COURIER_SAME_HOST=0 on '
                             "the bed's processes (TCP between the processes of one host)")
    parser.add_argument('--json', help='also write the numbers to this file')
    args = parser.parse_args()
    if args.role:
        serve_role(args.role, args.listen, args.sizes_mib[0], args.source)
        return
    if args.ray_only:
        print(json.dumps({str(size): broadcast_ray(size, args.actors, args.seconds)
                          for size in args.sizes_mib}))
        return
    with contextlib.ExitStack() as stack:
        hosts = None
        if set(args.systems) & set(_HOSTS):
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            from tests import testbeds  # pylint: disable=import-outside-toplevel
            hosts = stack.enter_context(testbeds.ssh_hosts(3))
        _run_all(args, hosts)


def _run_all(args: argparse.Namespace, hosts: Any) -> None:
    results: Dict[str, Any] = {'broadcast': {}, 'echo': {}}
    for size in args.sizes_mib:  # Ours and Ray alternate, size by size.
        row = results['broadcast'][size] = {}
        for system, relay in _HOSTS.items():
            if system in args.systems:
                row[system] = broadcast_hosts(hosts, size, args.actors, args.seconds, relay)
                if args.without_upgrade_too:
                    row[f'{system} no-upgrade'] = broadcast_hosts(
                        hosts, size, args.actors, args.seconds, relay, same_host=False)
        if 'ours' in args.systems:
            row['ours'] = broadcast_ours(size, args.actors, args.seconds)
        if 'ours-shared-array' in args.systems:  # The learner's parameters in shared memory.
            row['ours-shared-array'] = broadcast_ours(size, args.actors, args.seconds,
                                                      shared_array=True)
        if 'ours-socket' in args.systems:  # COURIER_SHARED_MEMORY=0: through the socket.
            row['ours-socket'] = broadcast_ours(size, args.actors, args.seconds, False)
        if 'ray' in args.systems:
            row['ray'] = _run_ray([size], args.actors, args.seconds)[size]
        _print_broadcast(size, row)
    for size in args.echo_mib:
        row = results['echo'][size] = {
            'shared memory': echo(size, True, args.seconds),
            'socket (COURIER_SHARED_MEMORY=0)': echo(size, False, args.seconds)}
        values = [numbers['mb_per_s'] for numbers in row.values()]
        print(f'echo {size:5} MiB  shared memory {values[0]:9,.0f} MB/s   socket '
              f'{values[1]:9,.0f} MB/s   ratio {values[0] / values[1]:.2f}', flush=True)
    if args.json:
        with open(args.json, 'w') as out:
            json.dump(results, out, indent=2)


def _print_broadcast(size: int, row: Dict[str, Any]) -> None:
    for system, numbers in row.items():
        if isinstance(numbers, str):
            print(f'broadcast {size:4} MiB  {system:26} {numbers}', flush=True)
            continue
        print(f'broadcast {size:4} MiB  {system:26} {numbers["rounds_per_s"]:8.1f} rounds/s  '
              f'learner CPU {numbers["learner_cpu_ms_per_round"]:7.1f} ms/round  host PSS peak '
              f'{numbers["host_pss_peak_mib"]:7.0f} MiB (above baseline '
              f'{numbers["host_pss_growth_copies"]:5.2f} copies'
              + (f', between rounds {numbers["host_pss_settled_growth_copies"]:5.2f}'
                 if 'host_pss_settled_growth_copies' in numbers else '')
              + f')  actors above baseline '
              f'{numbers["actors_pss_growth_copies"]:5.2f} copies'
              + (f'  learner sends/round {numbers["learner_sends_per_round"]:.1f}'
                 if 'learner_sends_per_round' in numbers else '')
              + (f'  learner segments (most) {numbers["learner_segments"]}'
                 if 'learner_segments' in numbers else ''), flush=True)
    ray = row.get('ray')
    for system in ('ours', 'ours-shared-array'):
        ours = row.get(system)
        if isinstance(ours, dict) and isinstance(ray, dict):
            print(f'broadcast {size:4} MiB  {system}/ray rounds/s '
                  f'{ours["rounds_per_s"] / ray["rounds_per_s"]:.2f}', flush=True)


if __name__ == '__main__':
    main()
