"""The in-job driver of a detached program: serves the program's coordinator and follows its steps.

Runs inside the Slurm job, on the node that runs the batch script, which starts it before the steps
as `python -m launchpad.launch.slurm.driver RUN_DIR` (see `shared.driver_argv`):

    batch script ──┬── driver (this module, in the background)
                   │     main thread: waits for the program to end, then exits 0 or 1
                   │     courier server threads: the program's coordinator
                   │     controller thread: StepRunner, reading the steps' exit code files
                   └── srun step ... (one per node, once RUN_DIR/coordinator exists)

The launcher wrote the job description to RUN_DIR; the driver writes the coordinator's endpoint
there, where the batch script and the steps read it. Its output, with the failure that ended the
program if any, goes to the job's job.out, and its exit code becomes the job's.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Sequence

from launchpad.launch.controller import Controller
from launchpad.launch.slurm import job, shared
from launchpad.launch.slurm.steps import StepRunner
from launchpad.policy import NodePolicy
from launchpad.process.coordinator import Coordinator, NodeFailedError, serve_coordinator


def main(argv: Sequence[str]) -> None:
    """Serves the program whose run directory is the last of `argv` until it ends; exits with 1
    if a node failed."""
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
    run_dir = argv[-1]
    info = shared.JobDescription.read(run_dir)
    job_id = os.environ['SLURM_JOB_ID']
    coordinator = Coordinator(info.nodes, policies={
        name: NodePolicy.from_json(policy) for name, policy in info.policies.items()})
    server = serve_coordinator(coordinator, job.coordinator_bind_endpoint(), tls=info.tls)
    shared.write_coordinator_endpoint(run_dir, server.address)
    runner = StepRunner(job_id, run_dir, info.steps, coordinator, watch_job=False,
                        closing=[server.Stop], batch_log=info.batch_log)
    controller = Controller(info.program, coordinator, runner,
                            launch_type='slurm', notice_period=info.notice_period)
    try:
        controller.wait()
    except NodeFailedError as e:
        print(f'Program {info.program!r} failed. {e}', flush=True)
        sys.exit(1)
    states = {name: status.state.value for name, status in controller.status().items()}
    print(f'Program {info.program!r} ended: {states}', flush=True)


if __name__ == '__main__':
    main(sys.argv)
