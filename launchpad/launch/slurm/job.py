"""Talking to Slurm about the program's job: `sbatch`, `squeue`, `scancel` and `scontrol`.

Runs wherever the job is watched: on the launching machine (submitting it, waiting for it to start,
following it, cancelling it), and inside a detached job (its driver asks where the Slurm controller
is, and cancels the job to end nodes that outlive a stop).
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from courier.transport import tcp_address

from launchpad.launch.slurm import addresses

# The state of each component of a job, and why it waits: [(state, reason)], as squeue says.
States = List[Tuple[str, str]]

_COMMANDS = ('sbatch', 'squeue', 'scancel', 'scontrol')
_ENDED_STATES = frozenset({
    'BOOT_FAIL', 'CANCELLED', 'COMPLETED', 'DEADLINE', 'FAILED', 'NODE_FAIL', 'OUT_OF_MEMORY',
    'PREEMPTED', 'REVOKED', 'TIMEOUT'})
# Pending reasons that waiting does not cure: the request does not fit the partition or account.
_HOPELESS_REASONS = frozenset({
    'AccountNotAllowed', 'BadConstraints', 'DependencyNeverSatisfied', 'InvalidAccount',
    'InvalidQOS', 'PartitionConfig', 'PartitionNodeLimit', 'PartitionTimeLimit', 'QOSNotAllowed'})


class SlurmError(RuntimeError):
    """Slurm refused or lost the program's job; the message includes what Slurm said."""


def require_commands() -> None:
    """Raises SlurmError unless Slurm's commands are on PATH."""
    missing = [command for command in _COMMANDS if shutil.which(command) is None]
    if missing:
        raise SlurmError(
            f'The slurm launch type needs Slurm\'s commands on PATH; {", ".join(missing)} not '
            'found. Launch from a Slurm login node, or add Slurm\'s bin directory to PATH.')


def run(argv: Sequence[str], what: str, *, env: Optional[Mapping[str, str]] = None,
        timeout: float = 60.0) -> str:
    """Runs a Slurm command and returns its output; SlurmError with Slurm's message if it fails."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f'{what}: `{shlex.join(argv)}` did not answer within {timeout:g} s; is '
                         'the Slurm controller up?') from e
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip() or f'exit code {done.returncode}'
        raise SlurmError(f'{what}: {message}')
    return done.stdout


def submit(script: str, program_name: str, output: str, env: Mapping[str, str]) -> str:
    """Submits the batch script `script` as the job of `program_name` and returns its id.

    The job runs in our working directory, with the environment `env`; its own output goes to
    `output`.
    """
    out = run(['sbatch', '--parsable', '--export=ALL', f'--job-name={program_name}',
               f'--output={output}', f'--chdir={os.getcwd()}', script],
              f'Slurm rejected the job of program {program_name!r}', env=env)
    return out.strip().split(';')[0]


def find(script: str) -> Optional[str]:
    """The id of this user's job whose batch script is `script` (submitted by `submit`), if
    Slurm knows one: how a job whose submitter died before it noted the id is found again."""
    out = run(['squeue', '--noheader', f'--user={os.getuid()}', '--states=all',
               '--format=%i|%o'], 'Cannot list the Slurm jobs', timeout=30)
    for line in out.splitlines():
        job_id, _, command = line.strip().partition('|')
        if command == script:
            return job_id
    return None


def controller_host() -> str:
    """The address of the Slurm controller, from `scontrol show config`."""
    config = run(['scontrol', 'show', 'config'], 'Cannot read the Slurm configuration')
    match = re.search(r'^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?', config, re.MULTILINE)
    if match is None:
        raise SlurmError('Cannot find SlurmctldHost in `scontrol show config`; pass '
                         'coordinator_host= to lp.launch.')
    return match[2] or match[1]


def coordinator_bind_endpoint(host: Optional[str] = None) -> str:
    """Where the program's coordinator binds: `host` (by default the address this machine uses to
    reach the Slurm controller, which the compute nodes can reach too), on a port the kernel
    picks."""
    return tcp_address(host or addresses.local_address(controller_host()), 0)


def states(job_id: str) -> Optional[States]:
    """(state, reason) of each component of the job; None once Slurm has forgotten it."""
    try:
        out = run(['squeue', '--noheader', f'--jobs={job_id}', '--states=all', '--format=%T|%r'],
                  f'Cannot read the state of Slurm job {job_id}', timeout=30)
    except SlurmError as e:
        if 'Invalid job id' in str(e):
            return None
        raise
    found = [tuple(line.split('|', 1)) for line in out.splitlines() if '|' in line]
    return found or None


def ended(job_states: Optional[States]) -> bool:
    """True if every component of the job has ended (or Slurm has forgotten the job)."""
    return job_states is None or all(state in _ENDED_STATES for state, _ in job_states)


def hopeless(job_states: Optional[States]) -> bool:
    """True if the job waits for a reason that waiting does not cure (it does not fit the
    partition or account)."""
    return any(reason in _HOPELESS_REASONS for _, reason in job_states or ())


def describe(job_states: Optional[States]) -> str:
    """The job's states and reasons, for a message."""
    if job_states is None:
        return 'no longer known to Slurm'
    return ', '.join(state + (f' ({reason})' if reason not in ('', 'None') else '')
                     for state, reason in dict.fromkeys(job_states))


def cancel(job_id: str) -> None:
    """Cancels the job (`scancel`), every step of it included; quietly does nothing if it ended."""
    subprocess.run(['scancel', '--quiet', job_id], capture_output=True, check=False,
                   stdin=subprocess.DEVNULL, timeout=60)


def cancel_steps(job_id: str, names: Sequence[str]) -> None:
    """Cancels the steps of the job named `names` (a node's step is named after it), leaving the
    job and its other steps running; steps that already ended are skipped."""
    out = run(['squeue', '--noheader', '--steps', f'--jobs={job_id}', '--format=%i|%j'],
              f'Cannot list the steps of Slurm job {job_id}', timeout=30)
    wanted = set(names)
    for line in out.splitlines():
        step_id, _, name = line.strip().partition('|')
        if name in wanted:
            subprocess.run(['scancel', '--quiet', step_id], capture_output=True, check=False,
                           stdin=subprocess.DEVNULL, timeout=60)


def wait_for_end(job_id: str, timeout: float) -> bool:
    """Waits until every step of the job has ended (the job left RUNNING and COMPLETING); False if
    `timeout` seconds passed first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ended(states(job_id)):
                return True
        except SlurmError as e:
            logging.warning('%s', e)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def wait_for_start(job_id: str, timeout: Optional[float], ran: Callable[[], bool],
                   waiting: Callable[[], None] = lambda: None) -> None:
    """Blocks until the job runs (or `ran()` says its steps already ran), calling `waiting()` at
    each look; SlurmError (after cancelling it) if it ends first or does not start within
    `timeout` seconds."""
    start = time.monotonic()
    interval, told = 0.05, False
    while True:
        waiting()
        now = states(job_id)
        if now is not None and all(state == 'RUNNING' for state, _ in now):
            return
        if ended(now):
            if ran():
                return
            raise SlurmError(f'Slurm job {job_id} ended before it started: {describe(now)}.')
        if hopeless(now):
            cancel(job_id)
            raise SlurmError(f'Slurm job {job_id} cannot start: {describe(now)}; the request '
                             'does not fit the partition or account. Cancelled it.')
        waited = time.monotonic() - start
        if timeout is not None and waited > timeout:
            cancel(job_id)
            raise SlurmError(
                f'Slurm job {job_id} did not start within {timeout:g} s (start_timeout); Slurm '
                f'says: {describe(now)}. Cancelled it. Ask for fewer resources, another '
                'partition, or a longer start_timeout (None waits for ever).')
        if not told and waited > 5:
            told = True
            print(f'Waiting for Slurm job {job_id} to start: {describe(now)}.',
                  file=sys.stderr, flush=True)
        time.sleep(interval)
        interval = min(interval * 2, 0.2 if waited < 10 else 1.0)
