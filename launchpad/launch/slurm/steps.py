"""`StepRunner`: a controller's view of the job's steps, from the exit code files the batch script
writes and from squeue.

Runs wherever the program's coordinator runs: on the launching machine for a program launched in
the foreground, inside the job (in the driver) for a detached one.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from launchpad.launch.runner import Runner
from launchpad.launch.slurm import job, shared
from launchpad.process import logs
from launchpad.process.coordinator import Coordinator

_JOB_POLL = 1.0  # seconds between squeue calls while the program runs
# The states of a job that was requeued and waits to run again.
_REQUEUED_STATES = frozenset({'PENDING', 'REQUEUED', 'REQUEUE_FED', 'REQUEUE_HOLD'})


class StepRunner(Runner):
    """The controller's runner for the steps of one Slurm job.

    A step's exit code comes from the file the batch script writes when its `srun` returns; a step
    that ends with a non-zero code without having reported a failure fails with the end of its
    log. A restart asks the batch script, through a file, to run the step again. With `watch_job` (on the launching machine) squeue also says when the whole job ended, for
    instance cancelled by hand or out of time, which fails the steps still running. Inside the job
    the runner does not watch it: when the job ends, the runner ends too.

    Args:
      job_id: the Slurm job.
      run_dir: the job's run directory, removed on release (None: no step to follow).
      steps: the steps to follow.
      coordinator: the program's coordinator, told about failures.
      watch_job: follow the job's state with squeue, and on release wait for the job to end
        (cancelling it if it does not).
      closing: called in this order on release, once the job has ended (e.g. the log follower's
        close, the coordinator server's Stop).
      batch_log: the batch script's output file, shown when a failed step's own log is empty.
      requeue: the job may be requeued (with `watch_job`): steps that end while the job leaves
        RUNNING have not failed, and a job pending again was requeued: every node runs again
        (`Coordinator.requeued`).
    """

    def __init__(self, job_id: str, run_dir: Optional[str], steps: Sequence[shared.WatchedStep],
                 coordinator: Coordinator, *, watch_job: bool,
                 closing: Sequence[Callable[[], None]] = (), batch_log: str = '',
                 requeue: bool = False):
        self._job_id = job_id
        self._run_dir = run_dir
        self._steps = list(steps)
        self._coordinator = coordinator
        self._watch_job = watch_job
        self._closing = list(closing)
        self._batch_log = batch_log
        self._codes: Dict[str, Optional[int]] = {step.name: None for step in self._steps}
        # Node name -> the attempt of its step it asked the batch script to run last (its
        # restarts then): an exit code of an attempt before it is an old run's.
        self._asked: Dict[str, int] = {}
        self._checked = time.monotonic()
        self._requeue = requeue
        self.requeues = 0  # how many times the job was requeued
        self._waiting_again = False  # it was requeued and has not run again yet
        self._left_checked = (float('-inf'), False)  # (when, whether the job was leaving)

    @property
    def output(self) -> StepRunner:
        """Where node output goes: each step's output file (`read_log`, for the observer)."""
        return self

    def read_log(self, name: str, cursor: Optional[int] = None) -> Tuple[List[str], int]:
        """Lines node `name`'s step wrote after byte `cursor` (None: its last lines), and the
        next cursor."""
        for step in self._steps:
            if step.name == name:
                return logs.read_file(step.log, cursor)
        raise LookupError(f'node {name!r} has no step in Slurm job {self._job_id}.')

    def poll(self) -> Dict[str, Optional[int]]:
        """Node name -> its step's exit code, or None while it runs."""
        self._read_exit_codes()
        running = [step for step in self._steps if self._codes[step.name] is None]
        if running and self._watch_job and time.monotonic() - self._checked >= _JOB_POLL:
            self._checked = time.monotonic()
            try:
                states = job.states(self._job_id)
            except job.SlurmError as e:
                logging.warning('%s', e)
                return dict(self._codes)
            if self._requeue and _requeued(states):
                if not self._waiting_again:
                    self._waiting_again = True
                    self._requeued(states)
                return dict(self._codes)
            self._waiting_again = False
            if job.ended(states):
                self._read_exit_codes()  # the batch script writes them before the job ends
                for step in running:
                    if self._codes[step.name] is None:
                        if not self._coordinator.stopping:
                            self._coordinator.node_failed(
                                step.name, f'Slurm job {self._job_id} ended while this node ran: '
                                           f'{job.describe(states)}. Its log: {step.log}')
                        self._codes[step.name] = -signal.SIGKILL
        return dict(self._codes)

    def _read_exit_codes(self) -> None:
        for index, name, log in self._steps:
            if self._codes[name] is not None or self._run_dir is None:
                continue
            try:
                with open(shared.exit_file(self._run_dir, index)) as f:
                    words = f.read().split()  # CODE ATTEMPT (see script.batch_script)
                code = int(words[0]) if words else 1
                attempt = int(words[1]) if len(words) > 1 else 0
            except (OSError, ValueError):
                continue
            if attempt < self._asked.get(name, 0):
                continue  # the run before the restart asked for
            if code != 0 and self._requeue and self._job_leaves():
                continue  # the job is requeued, preempted or cancelled: `poll` will tell
            if (code != 0 and not self._coordinator.stopping
                    and not self._coordinator.status()[name].state.ended):
                self._coordinator.node_failed(
                    name, f'its Slurm step ended with exit code {code} without reporting an error. '
                          f'Its log, {log}, ends with:\n{_tail(log) or _tail(self._batch_log)}')
            self._codes[name] = code

    def _job_leaves(self) -> bool:
        """True unless squeue says that the whole job is still running (a job seen leaving is
        not asked about again for `_JOB_POLL` s)."""
        now = time.monotonic()
        if not self._left_checked[1] or now - self._left_checked[0] >= _JOB_POLL:
            try:
                states = job.states(self._job_id)
                leaves = states is None or any(state != 'RUNNING' for state, _ in states)
            except job.SlurmError:
                leaves = True
            self._left_checked = (now, leaves)
        return self._left_checked[1]

    def _requeued(self, states: job.States) -> None:
        """The job was requeued: its run's exit codes go, and every node that had not finished
        will run again."""
        self.requeues += 1
        names = []
        status = self._coordinator.status()
        for index, name, _ in self._steps:
            if not self._in_job(name):
                continue  # it runs in an additional job, which was not requeued
            if status[name].state.ended:  # finished, dropped or removed: the next run skips it
                shared.write_whole(shared.ended_file(self._run_dir, index), '')
                if self._codes[name] is None:  # its step ended with the job
                    self._codes[name] = status[name].exit_code or 0
                continue
            names.append(name)
            self._codes[name] = None
            self._asked.pop(name, None)  # the job's next run starts from its first attempt
            for path in (shared.exit_file(self._run_dir, index),
                         shared.restart_file(self._run_dir, index)):
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
        self._coordinator.requeued(
            names, f'Slurm job {self._job_id} was requeued ({job.describe(states)}; requeue '
                   f'{self.requeues}): it runs again from its checkpoints')

    def _in_job(self, name: str) -> bool:
        """True if node `name` runs in the program's job (not in an additional one)."""
        del name
        return True

    def restart(self, name: str) -> None:
        """Asks the batch script to run the node's step again, in the job's allocation, as
        the attempt after the node's restarts so far: the script runs each attempt once, so
        asking again for the same (a new driver whose predecessor asked, but died before it
        noted the node's restart) runs it no more."""
        step = next(step for step in self._steps if step.name == name)
        if self._run_dir is None:
            raise RuntimeError('this runner does not follow the job\'s steps')
        if self._watch_job and job.ended(job.states(self._job_id)):
            raise RuntimeError(f'Slurm job {self._job_id} has ended')
        attempt = self._coordinator.status()[name].restarts + 1
        self._asked[name] = attempt
        self._codes[name] = None
        shared.write_whole(shared.restart_file(self._run_dir, step.index), str(attempt))

    def kill(self, names: Sequence[str]) -> None:
        """Cancels the job, which ends every step."""
        del names
        if self._run_dir is not None and not self._watch_job:
            shutil.rmtree(self._run_dir, ignore_errors=True)  # inside the job, scancel ends us too
        job.cancel(self._job_id)

    def release(self) -> None:
        """Makes sure the job has ended (when watched), then closes what it was given and removes
        the run directory."""
        try:
            if self._watch_job and not job.wait_for_end(self._job_id, timeout=3.0):
                job.cancel(self._job_id)
                if not job.wait_for_end(self._job_id, timeout=60.0):
                    logging.error('Slurm job %s is still running 60 s after scancel; check it with '
                                  '`squeue -j %s`.', self._job_id, self._job_id)
        finally:
            for close in self._closing:
                close()
            if self._run_dir is not None:
                shutil.rmtree(self._run_dir, ignore_errors=True)


def _requeued(states: Optional[job.States]) -> bool:
    """True if the job, seen running before, waits to run again: it was requeued."""
    return bool(states) and all(state in _REQUEUED_STATES for state, _ in states)


def _tail(path: str, lines: int = 10) -> str:
    """The last `lines` lines of the file at `path` ('' if it cannot be read)."""
    try:
        with open(path, 'rb') as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            text = f.read().decode(errors='replace')
    except OSError:
        return ''
    return '\n'.join(text.splitlines()[-lines:])
