"""The same workloads on Ray actors, the tool many RL researchers use instead of launchpad.

Each launchpad node becomes an actor with `num_cpus=0` (so dozens fit on a small machine) in a
private Ray instance that this script starts and shuts down. Services get
`max_concurrency=16`, the size of a courier server's thread pool. The node classes and
measurement loops are the ones the launchpad script runs (bench_nodes.py); actor handles are
wrapped to take courier's call shape (`peer.method(...)`, `peer.futures.method(...)`).

Launch time includes `ray.init`: starting the runtime is part of starting a program, as it is
in `lp.launch`.

    python ray_workloads.py --workload sync_calls --json
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, Tuple

import ray

import bench_harness
import bench_nodes

Metrics = Dict[str, float]
Details = Dict[str, Any]

SERVICE_CONCURRENCY = 16


class _Pending:
    """An outstanding actor call; `result()` waits for it, like a future."""
    __slots__ = ('_ref',)

    def __init__(self, ref: Any):
        self._ref = ref

    def result(self) -> Any:
        return ray.get(self._ref)


class Peer:
    """An actor handle with courier's call shape: `peer.m(...)` blocks, `peer.futures.m(...)`
    returns an object with `result()`. Picklable, so it can be handed to other actors."""

    def __init__(self, actor: Any, asynchronous: bool = False):
        self._actor = actor
        self._asynchronous = asynchronous

    @property
    def futures(self) -> 'Peer':
        return Peer(self._actor, asynchronous=True)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith('_'):
            raise AttributeError(name)
        method = getattr(self._actor, name)
        if self._asynchronous:
            return lambda *args, **kwargs: _Pending(method.remote(*args, **kwargs))
        return lambda *args, **kwargs: ray.get(method.remote(*args, **kwargs))


class Runner:
    """A node that runs one function: the actor form of `lp.PyNode`."""

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


_ACTOR_CLASSES: Dict[Tuple[type, int], Any] = {}
_RUNNING: list = []  # actor handles: Ray ends an actor once no handle to it is left


def _actor_class(cls: type, max_concurrency: int) -> Any:
    """The Ray actor class for `cls`, made once so that Ray exports each class once."""
    key = (cls, max_concurrency)
    if key not in _ACTOR_CLASSES:
        _ACTOR_CLASSES[key] = ray.remote(num_cpus=0, max_concurrency=max_concurrency)(cls)
    return _ACTOR_CLASSES[key]


def _service(cls: type, *args: Any) -> Peer:
    actor = _actor_class(cls, SERVICE_CONCURRENCY).remote(*args)
    _RUNNING.append(actor)
    return Peer(actor)


def _start_runner(fn: Callable[..., Any], *args: Any) -> None:
    """Starts a Runner actor that calls `fn(*args)`."""
    actor = _actor_class(Runner, 1).remote()
    _RUNNING.append(actor)
    _RUNNING.append(actor.run.remote(fn, *args))


def _init(session: bench_harness.Session) -> None:
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False,
             _temp_dir=session.path('ray'))


def _wait(session: bench_harness.Session, path: str, details: Details) -> Dict[str, Any]:
    result = bench_harness.read_result(path, session.deadline - 15)
    if 'error' in result:
        raise RuntimeError(f'an actor failed:\n{result["error"]}')
    details.update(result.get('details', {}))
    return result


def client_server(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    """An Echo server actor and a client actor that runs the workload's measurement."""
    measure, args = bench_nodes.client_measurement(session.workload.kind, session.params)
    _init(session)
    path = session.path('result.json')
    server = _service(bench_nodes.Echo)
    _start_runner(bench_harness.guarded, path, measure, server, *args)
    details: Details = {}
    result = _wait(session, path, details)
    return result['metrics'], details


def launch(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    path = session.path('result.json')
    launched_at = time.time()
    _init(session)
    details: Details = {'init_s': round(time.time() - launched_at, 4)}
    nodes = [_service(bench_nodes.Echo) for _ in range(session.params['nodes'])]
    _start_runner(bench_harness.guarded, path, bench_nodes.measure_pings, nodes)
    result = _wait(session, path, details)
    return {'launch_s': result['answered_at'] - launched_at}, details


def fanin(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    p = session.params
    _init(session)
    path = session.path('result.json')
    target = _service(bench_nodes.SleepyServer, p['server_sleep_s'])
    if p['cached']:
        target = _service(bench_nodes.Cacher, target, p['cache_refresh_s'])
    coordinator = _service(bench_nodes.Coordinator, p['requesters'], p['duration_s'], path)
    for _ in range(p['requesters']):
        _start_runner(bench_nodes.request_in_window, target, coordinator, p['duration_s'])
    details: Details = {}
    result = _wait(session, path, details)
    return result['metrics'], details


KINDS = {**dict.fromkeys(bench_nodes.CLIENT_SERVER_KINDS, client_server),
         'launch': launch, 'fanin': fanin}


def main() -> None:
    args = bench_harness.parse_args(__doc__.splitlines()[0])
    with bench_harness.Session('ray', ray.__version__, args) as session:
        try:
            metrics, details = KINDS[session.workload.kind](session)
        finally:
            _RUNNING.clear()
            ray.shutdown()
        session.emit(metrics, details)


if __name__ == '__main__':
    sys.exit(main())
