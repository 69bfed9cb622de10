"""Launchpad workloads, written once against dm-launchpad's public API.

Run it with the interpreter whose `launchpad` should be measured: ours (with the repository on
PYTHONPATH) or DeepMind's dm-launchpad from its own virtual environment. It finds out which one
it got and branches only where the two differ:

- dm-launchpad's Courier never completes a call that receives a numpy array (their issue 28), so
  the echo workload sends `array.tobytes()` to it and the server turns the bytes back into an
  array (returning arrays works);
- dm-launchpad's `lp.launch` returns a worker manager and its `lp.stop()` signals the launching
  process, so this script stops dm programs through the worker manager and never calls
  `lp.stop()`; ours returns a controller with `stop()` and `wait()`.

Every measurement happens inside a node (a process of the program, like a user's node); it
writes its result to a file that this launcher waits for, then the launcher stops the program.

    python launchpad_workloads.py --workload sync_calls --json
"""
from __future__ import annotations

import importlib.metadata
import os
import sys
import time
import traceback
from typing import Any, Dict, Tuple

import bench_harness
import bench_nodes
import launchpad as lp


def _detect_system() -> Tuple[str, str]:
    """('dm-launchpad', version) when the imported `launchpad` is DeepMind's, else ours."""
    here = os.path.realpath(os.path.dirname(lp.__file__))
    try:
        dist = importlib.metadata.distribution('dm-launchpad')
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None and os.path.realpath(str(dist.locate_file('launchpad'))) == here:
        return 'dm-launchpad', dist.version
    return 'launchpad', str(getattr(lp, '__version__', 'dev'))


SYSTEM, VERSION = _detect_system()
IS_DM = SYSTEM == 'dm-launchpad'

Metrics = Dict[str, float]
Details = Dict[str, Any]


# ----- the launcher side -----------------------------------------------------------------------

class NodeFailed(RuntimeError):
    """A node's measurement raised; the message carries its traceback."""


def _stop(launched: Any, details: Details) -> None:
    try:
        if IS_DM:
            launched.stop_and_wait()  # lp.stop() would SIGTERM this launching process
        else:
            launched.stop()
            launched.wait()
    except Exception as e:  # the measurement is done; report the stop problem, keep the numbers
        details['stop_error'] = f'{type(e).__name__}: {e}'
        print(traceback.format_exc(), file=sys.stderr)


def _run(session: bench_harness.Session, program: Any,
         result_path: str) -> Tuple[Dict[str, Any], Details]:
    """Launches `program` under local_mp, waits for the result file, stops the program."""
    details: Details = {}
    launched_at = time.time()
    launched = lp.launch(program, launch_type='local_mp', terminal='current_terminal')
    details['launch_call_s'] = round(time.time() - launched_at, 4)
    try:
        result = bench_harness.read_result(result_path, session.deadline - 15)
    finally:
        _stop(launched, details)
    if 'error' in result:
        raise NodeFailed(result['error'])
    result['launched_at'] = launched_at
    return result, details


def client_server(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    """A program of one Echo server and one client node that runs the workload's measurement."""
    measure, args = bench_nodes.client_measurement(session.workload.kind, session.params,
                                                   send_bytes=IS_DM)
    path = session.path('result.json')
    program = lp.Program(session.workload.name)
    server = program.add_node(lp.CourierNode(bench_nodes.Echo), label='server')
    program.add_node(lp.PyNode(bench_harness.guarded, path, measure, server, *args),
                     label='client')
    result, details = _run(session, program, path)
    return result['metrics'], {**result['details'], **details}


def launch(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    path = session.path('result.json')
    program = lp.Program(session.workload.name)
    with program.group('node'):
        handles = [program.add_node(lp.CourierNode(bench_nodes.Echo))
                   for _ in range(session.params['nodes'])]
    program.add_node(lp.PyNode(bench_harness.guarded, path, bench_nodes.measure_pings, handles),
                     label='pinger')
    result, details = _run(session, program, path)
    return {'launch_s': result['answered_at'] - result['launched_at']}, details


def fanin(session: bench_harness.Session) -> Tuple[Metrics, Details]:
    p = session.params
    path = session.path('result.json')
    program = lp.Program(session.workload.name)
    target = program.add_node(lp.CourierNode(bench_nodes.SleepyServer, p['server_sleep_s']),
                              label='server')
    if p['cached']:
        target = program.add_node(
            lp.CourierNode(bench_nodes.Cacher, target, p['cache_refresh_s']), label='cacher')
    coordinator = program.add_node(
        lp.CourierNode(bench_nodes.Coordinator, p['requesters'], p['duration_s'], path),
        label='coordinator')
    with program.group('requester'):
        for _ in range(p['requesters']):
            program.add_node(lp.PyNode(bench_nodes.request_in_window, target, coordinator,
                                       p['duration_s']))
    result, details = _run(session, program, path)
    return result['metrics'], {**result['details'], **details}


KINDS = {**dict.fromkeys(bench_nodes.CLIENT_SERVER_KINDS, client_server),
         'launch': launch, 'fanin': fanin}


def main() -> None:
    args = bench_harness.parse_args(__doc__.splitlines()[0])
    with bench_harness.Session(SYSTEM, VERSION, args) as session:
        metrics, details = KINDS[session.workload.kind](session)
        session.emit(metrics, details)


if __name__ == '__main__':
    main()
