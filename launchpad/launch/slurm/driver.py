"""The in-job driver of a detached program: supervises it inside its job, as the launching process
supervises a program launched in the foreground.

Runs inside the Slurm job, on the node that runs the batch script, which starts it before the steps
as `python -m launchpad.launch.slurm.driver RUN_DIR` (see `shared.driver_argv`):

    batch script ──┬── driver (this module, in the background)
                   │     main thread: waits for the program to end, then exits 0 or 1
                   │     courier server threads: the program's coordinator
                   │     controller thread: the step runner (exit code files; nodes added in
                   │       the allocation or in additional jobs), elastic groups, scaling policy
                   │     lp-observe-<id>: the program's registry entry and its run file;
                   │       its observer serves `lp.attach`'s calls too (`detached.CONTROL`)
                   └── srun step ... (one per node, once RUN_DIR/coordinator exists)

The launcher wrote what supervises the program (`launcher.JobSupervision`) to RUN_DIR; the driver
makes the same coordinator, step runner and controller from it as the launcher makes for a
program in the foreground, and writes the coordinator's endpoint there, where the batch script and
the steps read it. The program's history goes to its run file under RUNS (docs/runs.md), on the
filesystem the launching host shares. The driver's output, with the failure that ended the program
if any, goes to the job's job.out, and its exit code becomes the job's.

Its registry entry is in a registry of the job's own on the batch host (`reach.runtime_dir`,
given by the batch script), and published to RUN_DIR for the launcher, which registers the
program on the launching machine: every command there reaches the driver through a step of the
job (`reach`).
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Sequence

from launchpad.launch.slurm import job, reach, shared
from launchpad.launch.slurm.launcher import JobSupervision
from launchpad.launch.supervisor import _Control as Control  # what lp.attach calls
from launchpad.observe.observer import Observer
from launchpad.process.coordinator import NodeFailedError, serve_coordinator


def main(argv: Sequence[str]) -> None:
    """Supervises the program whose run directory is the last of `argv` until it ends; exits
    with 1 if a node failed."""
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
    run_dir = argv[-1]
    supervision = JobSupervision.read(run_dir)
    program = supervision.program
    coordinator = supervision.coordinator()
    server = serve_coordinator(coordinator, job.coordinator_bind_endpoint(),
                               auth_token=supervision.auth_token, tls=supervision.packer.tls)
    controller = supervision.controller(os.environ['SLURM_JOB_ID'], coordinator,
                                        watch_job=False, closing=[server.Stop])
    controller.attach(program, supervision.resources)
    controller.handle_signals()  # scancel: the program stops as a stop from its launcher would
    controller.observer = Observer(
        program, controller, program_id=supervision.program_id,
        served=Control(controller).methods(),
        # The batch script is its keeper: it cleans up after the driver (docs/slurm.md).
        entry_fields={'keeper_pid': os.getppid()}).start()
    if controller.observer.entry is not None:
        reach.publish(run_dir, controller.observer.entry)
    # The steps start once the endpoint is there, when the runner already says it is alive.
    shared.write_coordinator_endpoint(run_dir, server.address)
    try:
        controller.wait()
    except NodeFailedError as e:
        print(f'Program {program.name!r} failed. {e}', flush=True)
        sys.exit(1)
    states = {name: status.state.value for name, status in controller.status().items()}
    print(f'Program {program.name!r} ended: {states}', flush=True)


if __name__ == '__main__':
    main(sys.argv)
