"""A Slurm program's nodes added while it runs: the step runner that starts them, as new steps in
the job's allocation or in additional jobs, and the spec files every node is started from."""
from __future__ import annotations

import copy
import dataclasses
import logging
import os
import signal
import time
from typing import Any, Callable, Dict, Optional, Sequence

from launchpad.launch.slurm import job, script, shared
from launchpad.launch.slurm.resources import SlurmResources
from launchpad.launch.slurm.steps import StepRunner
from launchpad.process import output
from launchpad.process import spec as specs


def link_log(run_logs: Optional[str], step: script.Step) -> None:
    """Links `step`'s output file from the program's run directory (`run_logs`: its logs/, see
    `runstore.logs_directory`), as `<group>_<index>.log`, where `logs RUN NODE` and the
    dashboard of an ended run read a node's log; a link that cannot be made is told, not fatal
    (the output file is in the job directory still)."""
    if run_logs is None:
        return
    link = os.path.join(run_logs, output.log_file_name(step.executable.name))
    try:
        os.symlink(step.log, link)
    except OSError as e:
        logging.warning('The log of %s is not linked from the run directory (%s); it is %s.',
                        step.executable.name, e, step.log)


def write_spec(packer: specs.Packer, run_dir: str, step: script.Step, policy=None) -> str:
    """Writes the spec file of `step`'s node (`policy`: an added node's) into the run directory
    and returns its path: every node's one packing step, at launch or added later."""
    path = os.path.join(run_dir, f'{step.index}.spec')
    specs.write(packer.admit(step.executable, policy, args=step.resources.args,
                             env=step.resources.env), path)
    return path


class GrowingStepRunner(StepRunner):
    """The step runner of a program launched in the foreground, which can also add nodes.

    An added node runs as a new job step in the job's allocation while its group's component has
    a free task (its spare tasks, or those of nodes that ended), started by the batch script
    (`script.batch_script(growing=True)`). Beyond that it runs in an additional job of its own:
    the node's step alone, with its group's resources, its partition and account, and the job's
    environment (the program's token); its step joins the program's coordinator as any other.
    Such a job is cancelled once its node was removed and its step ended, or ended well, and
    every one of them on release.
    """

    def __init__(self, *args, packer: specs.Packer, components, resources, log_dir: str,
                 first_index: int, program_name: str, environment: Dict[str, str],
                 warning_seconds: Optional[int], run_logs: Optional[str] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._packer = packer
        self._components = components
        self._resources = resources
        self._log_dir = log_dir
        self._run_logs = run_logs  # where added nodes' logs are linked from (`link_log`)
        self._next_index = first_index
        self._program_name = program_name
        self._environment = environment
        self._warning_seconds = warning_seconds
        # Node name -> the number of its component, for the steps in the job's allocation.
        self._component_of = {step.executable.name: number
                              for number, component in enumerate(components)
                              for step in component.steps}
        # Node name -> the additional job that runs it; None while it is submitted (a new
        # driver finds it by its batch script, `restore`).
        self._additional: Dict[str, Optional[str]] = {}
        self._added_lines: Dict[int, str] = {}  # step index -> the batch script's line of a
        # node added in the allocation, written again when the job is requeued
        self._removed: set = set()
        self._checked_additional = time.monotonic()
        self._touched = 0.0
        # Called once an added node's step is followed, before it starts in the allocation: the
        # in-job driver writes the state a new driver re-adopts the program from, so that a
        # node that starts while its driver is replaced is not lost.
        self.persist: Callable[[], None] = lambda: None
        self._touch()

    # What a new driver's runner takes over from a dead one's (`state`, `restore`).
    _PERSISTED = ('_steps', '_codes', '_asked', '_next_index', '_component_of', '_additional',
                  '_added_lines', '_removed')

    def state(self) -> Dict[str, Any]:
        """The steps it follows and how they went, for a new driver to re-adopt them."""
        state = {name: copy.copy(getattr(self, name)) for name in self._PERSISTED}
        state['published'] = dict(self._packer.address_table.published)
        return state

    def restore(self, state: Dict[str, Any]) -> None:
        """Follows the steps a dead driver's runner followed (its `state`); an additional job
        it was submitting is found in the queue by its batch script, or submitted now."""
        state = dict(state)
        self._packer.address_table.published.update(state.pop('published'))
        for name, value in state.items():
            setattr(self, name, value)
        for step in self._steps:
            if step.name in self._additional and self._additional[step.name] is None:
                try:
                    self._additional[step.name] = (
                        job.find(self._batch_script(step.index))
                        or self._submit_additional(step.index, step.name))
                except job.SlurmError as e:
                    logging.warning('The additional job of %s, which a driver that died was '
                                    'submitting, is not followed (see squeue): %s', step.name, e)

    def _touch(self) -> None:
        self._touched = time.monotonic()
        adding_alive(self._run_dir)

    def poll(self):
        if time.monotonic() - self._touched > 1.0:
            self._touch()
        super().poll()
        if self._additional:
            self._follow_additional_jobs()
        return dict(self._codes)

    def check_add(self, label: str) -> None:
        """Only groups the job was planned with can grow."""
        self._component_number(label)

    def _component_number(self, label: str) -> int:
        group = self._resources.get(label) or SlurmResources()
        key = script.component_key(label, group)
        numbers = [n for n, c in enumerate(self._components)
                   if script.component_key(label, c.resources) == key]
        if not numbers:
            raise ValueError(f'Group {label!r} was not in the program when it was launched, so '
                             'the Slurm job has no room for it; add nodes to groups it had.')
        return numbers[0]

    def add_executable(self, label: str, executable, policy) -> None:
        """Runs the node as a new step: in the allocation if its component has a free task, in
        an additional job otherwise."""
        group = self._resources.get(label) or SlurmResources()
        number = self._component_number(label)
        component = self._components[number]
        busy = sum(1 for name, n in self._component_of.items()
                   if n == number and self._codes.get(name) is None)
        index = self._next_index
        self._next_index += 1
        log = os.path.join(self._log_dir, f'{script.log_stem(executable.name)}-{index}.out')
        step = script.Step(index, executable, group, log)
        link_log(self._run_logs, step)
        self._packer.address_table.published.update(
            {address.id: '<node address>:0' for address in executable.addresses})
        spec_path = write_spec(self._packer, self._run_dir, step, policy)
        waits = restart_waits([step], {executable.name: policy})
        if busy >= len(component.steps) + component.spare:
            self._write_additional(step, spec_path, waits)
            self._additional[executable.name] = None
            self._follow(step)  # before its job is submitted: a new driver finds that job
            try:
                self._additional[executable.name] = self._submit_additional(step.index,
                                                                            executable.name)
            except BaseException:
                self._steps.pop()
                del self._codes[executable.name], self._additional[executable.name]
                self.persist()
                raise
            self.persist()
        else:
            line = script.step_line(step, spec_path, number if len(self._components) > 1 else None,
                                    waits.get(index, 0))
            self._added_lines[index] = line
            self._component_of[executable.name] = number
            self._follow(step)  # before it starts: a new driver adopts it even while it starts
            shared.write_whole(shared.add_file(self._run_dir, index), line)

    def _follow(self, step: script.Step) -> None:
        """Follows the added node's step from now on, and says so (`persist`)."""
        self._steps.append(step.watched())
        self._codes[step.executable.name] = None
        self.persist()

    def _in_job(self, name: str) -> bool:
        return name not in self._additional

    def _requeued(self, states) -> None:
        """The job's next run starts the nodes added in its allocation again too."""
        super()._requeued(states)
        for index, name, _ in self._steps:
            if index in self._added_lines and self._codes.get(name) is None:
                shared.write_whole(shared.add_file(self._run_dir, index), self._added_lines[index])

    def _batch_script(self, index: int) -> str:
        """The batch script of the additional job of added step `index`."""
        return os.path.join(self._run_dir, f'{index}.sh')

    def _write_additional(self, step: script.Step, spec_path: str, waits) -> None:
        """Writes the batch script of a job that runs `step` alone, as the program's job runs
        its steps."""
        with open(self._batch_script(step.index), 'w') as f:
            f.write(script.batch_script(
                self._program_name,  # one task on one machine: the group's `nodes` does not apply
                [script.Component(dataclasses.replace(step.resources, nodes=None), [step])],
                self._run_dir,
                {step.index: spec_path}, restart_waits=waits,
                warning_seconds=self._warning_seconds))

    def _submit_additional(self, index: int, name: str) -> str:
        """Submits the additional job of node `name` (added step `index`); returns its id."""
        job_id = job.submit(self._batch_script(index), f'{self._program_name}:{name}',
                            os.path.join(self._log_dir, f'job-{index}.out'), self._environment)
        logging.info('%s runs in additional Slurm job %s (its group has no free task in job %s).',
                     name, job_id, self._job_id)
        return job_id

    def remove(self, name: str) -> None:
        """Notes that `name` leaves: its additional job, if any, is cancelled once its step
        ended (the node itself learns it from the coordinator)."""
        self._removed.add(name)

    def _follow_additional_jobs(self) -> None:
        """Cancels the additional jobs whose node is done; fails the nodes whose job ended or
        cannot start while they should run."""
        for name, job_id in list(self._additional.items()):
            code = self._codes.get(name)
            if job_id is None:
                continue  # being submitted
            if code is not None and (name in self._removed or code == 0):
                job.cancel(job_id)
                del self._additional[name]
        if not self._additional or time.monotonic() - self._checked_additional < 1.0:
            return
        self._checked_additional = time.monotonic()
        for name, job_id in list(self._additional.items()):
            if self._codes.get(name) is not None or job_id is None:
                continue
            try:
                states = job.states(job_id)
            except job.SlurmError as e:
                logging.warning('%s', e)
                continue
            why = None
            if job.ended(states):
                self._read_exit_codes()  # its batch script writes the code before it ends
                if self._codes.get(name) is None:
                    why = f'its Slurm job {job_id} ended while it ran: {job.describe(states)}'
            elif job.hopeless(states):
                job.cancel(job_id)
                why = (f'its Slurm job {job_id} cannot start: {job.describe(states)}; the '
                       "group's resources do not fit the partition or account. Cancelled it")
            if why is not None:
                if not self._coordinator.stopping and name not in self._removed:
                    self._coordinator.node_failed(name, f'{why}. Its log: {self._log_of(name)}')
                self._codes[name] = -signal.SIGKILL

    def _log_of(self, name: str) -> str:
        return next(step.log for step in self._steps if step.name == name)

    def kill(self, names: Sequence[str]) -> None:
        """Cancels the additional jobs of `names` (their steps count as ended once squeue says
        so) and the steps of removed nodes (the program runs on); the others end with the
        program's job."""
        rest, removed = [], []
        for name in names:
            if name in self._additional:
                if self._additional[name] is not None:
                    job.cancel(self._additional[name])
            elif name in self._removed:
                removed.append(name)
            else:
                rest.append(name)
        if removed:
            try:
                job.cancel_steps(self._job_id, removed)
            except job.SlurmError as e:
                logging.warning('Could not cancel the steps of removed nodes %s (%s); cancelling '
                                'the job.', ', '.join(removed), e)
                rest += removed
        if rest or not names:
            super().kill(rest)

    def release(self) -> None:
        try:
            with open(os.path.join(self._run_dir, shared.ADDING_ENDS), 'w'):
                pass  # the batch script starts no more steps: the job can end
        except FileNotFoundError:
            pass  # a detached program's kill removed the run directory: it starts none
        try:
            jobs = [job_id for job_id in self._additional.values() if job_id is not None]
            for job_id in jobs:
                job.cancel(job_id)
            for job_id in jobs:
                if not job.wait_for_end(job_id, timeout=60.0):
                    logging.error('Slurm job %s is still running 60 s after scancel; check it '
                                  'with `squeue -j %s`.', job_id, job_id)
        finally:
            super().release()


def adding_alive(run_dir: str) -> None:
    """Touches the file whose freshness keeps the batch script starting added nodes' steps
    (`shared.ADDING_ALIVE`): while the job waits in the queue, then while the runner runs."""
    path = os.path.join(run_dir, shared.ADDING_ALIVE)
    with open(path, 'a'):
        os.utime(path)


def restart_waits(steps, policies) -> Dict[int, float]:
    """Step index -> how long its failed step waits to be restarted: the longest backoff of its
    policy and a minute for the runner to notice (steps without restarts do not wait)."""
    waits = {}
    for step in steps:
        policy = policies.get(step.executable.name)
        if policy is not None and policy.restart is not None and policy.restart.max_restarts:
            waits[step.index] = policy.restart.max_backoff + 60.0
    return waits
