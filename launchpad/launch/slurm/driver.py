"""The in-job driver of a detached program: supervises it inside its job, as the launching process
supervises a program launched in the foreground.

Runs inside the Slurm job, on the node that runs the batch script, which starts it before the steps
as `python -m launchpad.launch.slurm.driver RUN_DIR` (see `shared.driver_argv`):

    batch script ──┬── driver (this module, in the background; a new one if it is killed)
                   │     main thread: waits for the program to end, then exits 0 or 1
                   │     courier server threads: the program's coordinator
                   │     controller thread: the step runner (exit code files; nodes added in
                   │       the allocation or in additional jobs), elastic groups, scaling policy
                   │     lp-observe-<id>: the program's registry entry and its run file;
                   │       its observer serves `lp.attach`'s calls too (`detached.CONTROL`)
                   │     lp-slurm-persist: writes RUN_DIR/state.pkl when the program changed
                   └── srun step ... (one per node, once RUN_DIR/coordinator exists)

The launcher wrote what supervises the program (`launcher.JobSupervision`) to RUN_DIR; the driver
makes the same coordinator, step runner and controller from it as the launcher makes for a
program in the foreground, and writes the coordinator's endpoint there, where the batch script and
the steps read it. The program's history goes to its run file under RUNS (docs/runs.md), on the
filesystem the launching host shares. The driver's output, with the failure that ended the program
if any, goes to the job's job.out, and its exit code becomes the job's.

When the driver is killed (SIGKILL, the OOM killer), the batch script starts a new one, which
re-adopts the running steps from RUN_DIR/state.pkl: it serves the same coordinator state at the
same endpoint, and the nodes, which wait `shared.DRIVER_GRACE` seconds for it, report to it
again; no step is restarted.

Its registry entry is in a registry of the job's own on the batch host (`reach.runtime_dir`,
given by the batch script), and published to RUN_DIR for the launcher, which registers the
program on the launching machine: every command there reaches the driver through a step of the
job (`reach`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence

from launchpad.launch.slurm import job, reach, shared
from launchpad.launch.slurm.launcher import JobSupervision
from launchpad.launch.supervisor import PERSIST_INTERVAL, Persister
from launchpad.launch.supervisor import _Control as Control  # what lp.attach calls
from launchpad.observe import registry
from launchpad.observe.observer import Observer
from launchpad.process.coordinator import NodeFailedError, serve_coordinator


def main(argv: Sequence[str]) -> None:
    """Supervises the program whose run directory is the last of `argv` until it ends, or takes
    it over from a killed driver; exits with 1 if a node failed."""
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
    run_dir = argv[-1]
    supervision = JobSupervision.read(run_dir)
    state = _read_state(run_dir)
    if state is None:
        coordinator = supervision.coordinator()
        endpoint = job.coordinator_bind_endpoint()
    else:  # the program as it grew, the nodes' states and the endpoint they know
        supervision.program = pickle.loads(state['program'])
        coordinator = state['coordinator']
        endpoint = shared.read_coordinator_endpoint(run_dir)
    program = supervision.program
    server = serve_coordinator(coordinator, endpoint, auth_token=supervision.auth_token,
                               tls=supervision.packer.tls)
    controller = supervision.controller(os.environ['SLURM_JOB_ID'], coordinator,
                                        watch_job=False, closing=[server.Stop],
                                        runner_state=state and state['runner'])
    controller.attach(program, supervision.resources)
    if state is not None and state['scaler'] is not None:
        controller._elastic._scaler = state['scaler']  # pylint: disable=protected-access
    write_state = _keep_state(run_dir, controller, program)
    controller.handle_signals()  # scancel: the program stops as a stop from its launcher would
    controller.observer = Observer(
        program, controller, program_id=supervision.program_id,
        served=Control(controller).methods(),
        entry_fields={'keeper_pid': os.getppid()}).start()  # the batch script (see script.py)
    if controller.observer.entry is not None:
        reach.publish(run_dir, controller.observer.entry)
    if state is None:  # the steps start once the endpoint is there; a driver killed from then
        write_state(True)  # on is replaced by one that re-adopts them from the state
        shared.write_coordinator_endpoint(run_dir, server.address)
    else:
        print(f'Driver pid {os.getpid()} re-adopted program {program.name!r} '
              f'({len(coordinator.status())} nodes).', flush=True)
    threading.Thread(target=_persist_while_running, args=(controller, write_state), daemon=True,
                     name='lp-slurm-persist').start()
    try:
        controller.wait()
    except NodeFailedError as e:
        print(f'Program {program.name!r} failed. {e}', flush=True)
        sys.exit(1)
    finally:  # its registry, emptied by the observer (the batch script may not outlive a scancel)
        with contextlib.suppress(OSError, KeyError):
            os.rmdir(os.environ[registry.ENV])
    states = {name: status.state.value for name, status in controller.status().items()}
    print(f'Program {program.name!r} ended: {states}', flush=True)


def _read_state(run_dir: str) -> Optional[Dict[str, Any]]:
    """What a killed driver persisted (`_keep_state`), or None at the program's start."""
    try:
        with open(os.path.join(run_dir, shared.STATE_FILE), 'rb') as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None


def _keep_state(run_dir: str, controller, program) -> Callable[[bool], None]:
    """Returns what writes the state a new driver re-adopts the program from to
    RUN_DIR/state.pkl, in the supervisors' format (`supervisor.Persister`): the coordinator (the
    nodes' states, addresses and restart budgets, the groups), the step runner's steps
    ('runner'), the program as it grew and its scaling policy's state ('scaler').

    Called with False, it writes the state if it changed (the driver's lp-slurm-persist thread
    looks every PERSIST_INTERVAL seconds); with True, at once: the first driver before the
    program's steps start, and the step runner before it starts the step of an added node, so
    that a driver killed while a node starts is replaced by one that knows of that node."""
    # pylint: disable=protected-access  (the supervisors persist the scaler so too)
    runner = controller._runner
    persister = Persister(os.path.join(run_dir, shared.STATE_FILE), program,
                          lambda: {'scaler': controller._elastic._scaler})
    told = ['']  # the last failure told

    def write(now: bool) -> None:
        try:
            persister(lambda: {'coordinator': controller.coordinator, 'commands': {},
                               'runner': runner.state()}, now=now)
        except Exception as e:  # pylint: disable=broad-except  (changed while pickled, say)
            if told[0] != repr(e):  # the next look may do; a lasting failure is told once
                told[0] = repr(e)
                logging.warning('The state a new driver would re-adopt the program from could '
                                'not be written: %r', e)

    runner.persist = lambda: write(True)
    return write


def _persist_while_running(controller, write: Callable[[bool], None]) -> None:
    """Writes the state whenever it changed, until the program ends."""
    while not controller.done:
        write(False)
        time.sleep(PERSIST_INTERVAL)


if __name__ == '__main__':
    main(sys.argv)
