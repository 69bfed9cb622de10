"""The names the launching machine and the job share: the files of the run directory, what they
hold, and the module of the in-job driver.

The launching machine and the compute nodes share a filesystem; they talk through the job's run
directory. The launcher writes what supervises the program there (detached mode); the in-job
driver reads it and writes the coordinator's endpoint, which the batch script and the steps
read; the batch script writes each step's exit code, which the step runner reads on either side. This module is
imported on both sides, and in the steps of a detached program (their specs hold
`read_coordinator_endpoint`), so it needs nothing but the standard library.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import List, NamedTuple

# `python -m DRIVER_MODULE RUN_DIR` serves a detached program's coordinator inside its job.
DRIVER_MODULE = 'launchpad.launch.slurm.driver'
# The coordinator's endpoint, written (whole, by a rename) by the in-job driver.
COORDINATOR_FILE = 'coordinator'
# The batch script writes step INDEX's exit code to INDEX + EXIT_SUFFIX (whole, by a rename).
EXIT_SUFFIX = '.exit'
# The step runner asks the batch script to run failed step INDEX again with INDEX + RESTART_SUFFIX.
RESTART_SUFFIX = '.restart'
# The step runner has the batch script start the step of a node added while the program runs by
# writing its `step` line to INDEX + ADD_SUFFIX, and ends that by writing ADDING_ENDS.
ADD_SUFFIX = '.add'
# The step runner marks a node that ended for good with INDEX + ENDED_SUFFIX when the job is
# requeued: its next run leaves the node out.
ENDED_SUFFIX = '.ended'
ADDING_ENDS = 'adding.end'
# ... and touches ADDING_ALIVE while it runs: silent for ADDING_SILENCE seconds, it is gone.
ADDING_ALIVE = 'adding.alive'
ADDING_SILENCE = 10  # (nodes give up on a lost coordinator after 5 s: a job ends soon after)
# What supervises a detached program (`launcher.JobSupervision`: the program, its plan, token
# and TLS credentials), written by the launcher for the in-job driver; only its user can read it.
SUPERVISION_FILE = 'supervision.pkl'


# A detached program's driver writes what a new one re-adopts the program from to STATE_FILE;
# the batch script starts a new one when it is killed (at most DRIVER_RESTARTS times), and the
# nodes run on DRIVER_GRACE seconds without a driver.
STATE_FILE = 'state.pkl'
DRIVER_RESTARTS = 5
DRIVER_GRACE = 60.0


def driver_argv(run_dir: str) -> List[str]:
    """The command line that runs the in-job driver of the program whose run directory is
    `run_dir`, with our Python."""
    return [sys.executable, '-m', DRIVER_MODULE, run_dir]


def exit_file(run_dir: str, index: int) -> str:
    """Where the batch script writes the exit code of step `index`."""
    return os.path.join(run_dir, f'{index}{EXIT_SUFFIX}')


def add_file(run_dir: str, index: int) -> str:
    """Where the step runner asks the batch script to start added step INDEX."""
    return os.path.join(run_dir, f'{index}{ADD_SUFFIX}')


def restart_file(run_dir: str, index: int) -> str:
    """Where the step runner asks the batch script to run step `index` again."""
    return os.path.join(run_dir, f'{index}{RESTART_SUFFIX}')


def ended_file(run_dir: str, index: int) -> str:
    """Where the step runner of a requeued job marks step `index` as ended for good: the job's
    next run does not start it."""
    return os.path.join(run_dir, f'{index}{ENDED_SUFFIX}')


def write_whole(path: str, text: str) -> None:
    """Writes `text` to `path` by a rename: readers (the batch script, the step runner) never
    see a partial file."""
    partial = path + '.tmp'
    with open(partial, 'w') as f:
        f.write(text)
    os.replace(partial, path)


def write_coordinator_endpoint(run_dir: str, endpoint: str) -> None:
    """Publishes the coordinator's endpoint."""
    write_whole(os.path.join(run_dir, COORDINATOR_FILE), endpoint)


def read_coordinator_endpoint(run_dir: str) -> str:
    """The coordinator's endpoint, once the driver has written it."""
    with open(os.path.join(run_dir, COORDINATOR_FILE)) as f:
        return f.read().strip()


def job_requeuing() -> bool:
    """True if the job of this step is leaving RUNNING as a whole (requeued, preempted or
    cancelled) rather than ending this step alone: a requeued program's nodes, sent SIGTERM,
    ask it (`WorkerSpec.requeue_check`) to end without a word and run again."""
    job_id = os.environ.get('SLURM_JOB_ID')
    if not job_id:
        return False
    done = subprocess.run(['squeue', '--noheader', f'--jobs={job_id}', '--states=all',
                           '--format=%T'], capture_output=True, text=True, timeout=10,
                          stdin=subprocess.DEVNULL, check=False)
    states = done.stdout.split()
    return done.returncode == 0 and bool(states) and any(s != 'RUNNING' for s in states)


class WatchedStep(NamedTuple):
    """A job step as the step runner follows it."""
    index: int  # its place in the batch script, which names its exit code file
    name: str   # its node's name
    log: str    # its output file
