"""The slurm launcher: runs a program as one Slurm job in which every node is a job step.

    lp.launch(program, launch_type='slurm', resources={
        'learner': lp.SlurmResources(cpus=8, mem='32G', gpus=1),
        'actor': lp.SlurmResources(cpus=1)})

Runs on the launching machine (a Slurm login node, say). Groups that ask for the same resources
share one job component; groups that ask for different ones become the components of a
heterogeneous job. Each executable runs as its own job step (`srun --exact`, so steps run side by
side). The launcher serves the program's coordinator on the address this host uses to reach the
Slurm controller; a node's servers bind the address its host uses to reach the coordinator, on a
port the kernel picks, and publish the endpoint to the coordinator, so ports never collide. The
program's auth token reaches the steps through the job's environment, never a command line.
Nodes added to a running program run as new steps in the job's allocation while their group has a
free task there, and beyond it each in an additional job of its own (`growing.GrowingStepRunner`).

The launching host and the compute nodes must share a filesystem, as the home directories of most
clusters are: the job directory (`job_dir=`, or $LAUNCHPAD_SLURM_DIR, default ~/launchpad_slurm)
holds the batch script, the nodes' specs and exit codes (removed when the program ends) and the
nodes' logs (kept), and the steps run the launcher's Python interpreter.

A program launched in the foreground lives in these threads of the launching process:

    main thread          lp.launch: writes the run directory, serves the coordinator, submits the
                         job, waits until it starts, returns the SlurmController
    courier threads      the program's coordinator, which every step calls
    controller thread    StepRunner (steps.py): reads the steps' exit code files, and squeue;
                         submits and cancels additional jobs (growing.py)
    lp-slurm-logs        LogFollower (log_follower.py): copies the steps' output files to stdout

A detached program (detach=True) has the same coordinator, step runner and controller inside the
job, in the driver (driver.py), made from the `JobSupervision` the launcher writes to the run
directory. lp.launch returns once the driver serves it and every node runs, with a controller
that reaches the driver through a step of the job (`reach`), as `lp.attach` and the commands of
`python -m launchpad.launch` do; no thread of ours follows it.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pickle
import secrets
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from launchpad.launch import detached
from launchpad.launch.controller import Controller
from launchpad.launch.launcher import (Launcher, LaunchOptions, executables_of, log_dir_of,
                                       policies_of, stop_order_of)
from launchpad.launch.slurm import addresses, growing, job, reach, script, shared
from launchpad.launch.slurm.log_follower import LogFollower
from launchpad.launch.slurm.resources import SlurmResources
from launchpad.resources import Resources
from launchpad.observe import registry
from launchpad.policy import NodePolicy
from launchpad.process import spec as specs
from launchpad.process.coordinator import Coordinator, serve_coordinator
from launchpad.process.states import NodeState
from launchpad.process.stop_order import StopOrder
from launchpad.program import Program

JOB_DIR_ENV = 'LAUNCHPAD_SLURM_DIR'
# Seconds before the time limit at which a requeue=True job requeues itself, unless told.
_REQUEUE_WARNING = 120


@dataclasses.dataclass
class SlurmOptions:
    """The slurm launcher's keyword arguments of `lp.launch`.

    Attributes:
      detach: the job runs on its own, supervised by its driver; lp.launch returns once every
        node runs, with a controller that reaches the driver (`SlurmAttachedController`).
      job_dir: where the job's files go, on a filesystem the compute nodes share.
      start_timeout: seconds to wait for the job to start; None waits for ever.
      coordinator_host: the address compute nodes reach this host at.
      stop_before_time_limit: seconds before the job's time limit at which Slurm warns the steps
        (SIGUSR1, `--signal`), which stops the program: stop handlers run while there is time.
        Slurm may send it up to a minute early. None: the time limit ends the job unannounced.
      spare_tasks: tasks the job reserves for each elastic group to grow into, at most its
        `max_size` minus its initial size (None: all of that). A node added beyond its group's
        free tasks runs in an additional job (docs/elastic.md); 0 reserves nothing.
      requeue: the job may be requeued (`--requeue`): when Slurm preempts or requeues it
        (`scontrol requeue JOB`), every node's stop handlers run, and the job runs again as the
        same program, each node's `attempt` one more, its checkpoints in place. The time limit
        requeues it too: `stop_before_time_limit` (default 120) seconds before it, the batch
        script requeues the job. See docs/checkpoints.md.
    """
    detach: bool = False
    job_dir: Optional[str] = None
    start_timeout: Optional[float] = 600.0
    coordinator_host: Optional[str] = None
    stop_before_time_limit: Optional[int] = None
    spare_tasks: Optional[int] = None
    requeue: bool = False

    def __post_init__(self):
        if self.requeue and self.detach:
            raise ValueError('requeue=True needs the program\'s coordinator outside the job, '
                             'which a detached program has not (a requeue would end it); '
                             'launch in the foreground to requeue.')
        spare = self.spare_tasks
        if spare is not None and (not isinstance(spare, int) or isinstance(spare, bool)
                                  or spare < 0):
            raise ValueError(f'spare_tasks must be a whole number >= 0 (tasks the job reserves '
                             f'for each elastic group to grow into) or None, got {spare!r}.')
        value = self.stop_before_time_limit
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 0 < value <= 65535):
            raise ValueError(f'stop_before_time_limit must be a whole number of seconds from 1 to '
                             f'65535 (Slurm\'s --signal), got {value!r}.')


class SlurmController(Controller):
    """The controller of a program launched on Slurm in the foreground.

    Attributes:
      job_id: the Slurm job that runs the program.
      log_dir: where each node's output file (and the batch script's, job.out) is.
    """

    def __init__(self, *args, job_id: str, log_dir: str, **kwargs):
        self.job_id = job_id
        self.log_dir = log_dir
        super().__init__(*args, **kwargs)


class SlurmAttachedController(detached.AttachedController):
    """The controller `lp.launch(..., detach=True)` returns: an `lp.AttachedController`, which
    reaches the program's driver in its job as `lp.attach` does.

    Attributes:
      job_id: the Slurm job that runs the program.
      log_dir: where each node's output file (and the batch script's, job.out) is.
    """

    def __init__(self, entry, log_dir: str):
        super().__init__(entry)
        self.job_id = entry.job
        self.log_dir = log_dir


class SlurmLauncher(Launcher):
    """Runs a program as one Slurm job (see the module docstring; options: `SlurmOptions`)."""

    foreground = True
    resource_types = (SlurmResources, Resources)
    # Node output goes to files, streamed here (current_terminal) or not (output_to_files).
    terminals = ('current_terminal', 'output_to_files')
    options = SlurmOptions

    def group_resources(self, label: str, resources) -> SlurmResources:
        """An `lp.Resources` as the Slurm request it maps to."""
        if isinstance(resources, Resources):
            return SlurmResources.from_resources(resources)
        return resources

    def launch(self, program: Program, options: LaunchOptions) -> SlurmController:
        settings, terminal = options.settings, options.terminal
        executables = executables_of(program, options)
        job.require_commands()
        job_dir = _make_job_dir(settings.job_dir, program.name)
        try:
            return self._launch(program, options, settings, terminal, executables, job_dir)
        except BaseException:
            shutil.rmtree(job_dir, ignore_errors=True)
            raise

    def _launch(self, program, options, settings, terminal, executables, job_dir):
        run_dir = os.path.join(job_dir, 'run')
        log_dir = os.path.join(job_dir, 'logs')
        batch_log = os.path.join(log_dir, 'job.out')
        components = script.plan(executables, options.resources, log_dir, spare={
            label: _spare_tasks(elastic.max_size, len(program.groups.get(label, ())),
                                settings.spare_tasks)
            for label, elastic in program.elastic_groups.items()})
        steps = sorted((s for c in components for s in c.steps), key=lambda s: s.index)
        token = secrets.token_hex(16)
        program_id = options.program_id or (registry.new_id(program.name) if settings.detach
                                            else None)
        # The run directory's logs/ links to each node's output file (always kept, in files).
        run_logs = log_dir_of(dataclasses.replace(options, terminal='output_to_files',
                                                  program_id=program_id))
        for step in steps:
            growing.link_log(run_logs, step)
        policies = policies_of(program, executables)
        supervision = JobSupervision(
            program=program, launch_type=options.launch_type, resources=dict(options.resources),
            notice_period=options.notice_period, policies=policies,
            stop_order=stop_order_of(program, executables, options.notice_period),
            steps=[step.watched() for step in steps], components=components, run_dir=run_dir,
            log_dir=log_dir, batch_log=batch_log, environment=_job_environment(token),
            # An additional job's steps are not requeued; they are not warned either then.
            warning_seconds=None if settings.requeue else settings.stop_before_time_limit,
            requeue=settings.requeue, auth_token=token, run_logs=run_logs)
        server = coordinator = None
        if settings.detach:
            coordinator_address = functools.partial(shared.read_coordinator_endpoint, run_dir)
            supervision.program_id = program_id
        else:
            coordinator = supervision.coordinator()
            server = serve_coordinator(
                coordinator, job.coordinator_bind_endpoint(settings.coordinator_host),
                auth_token=token, tls=options.tls)
            coordinator_address = server.address
        try:
            table = addresses.NodeAddressTable(
                published={address.id: '<node address>:0'
                           for _, executable in executables for address in executable.addresses},
                coordinator=coordinator_address)
            supervision.packer = specs.Packer(
                program.name, options.launch_type, table, coordinator_address,
                notice_period=options.notice_period, tls=options.tls, policies=policies,
                stop_signal=script.WARNING_SIGNAL if (settings.stop_before_time_limit
                                                      and not settings.requeue) else None,
                checkpoint_root=os.path.join(run_dir, 'checkpoints'),
                requeue_check=shared.job_requeuing if settings.requeue else None,
                # A detached program's nodes wait that long for a new driver (driver.py).
                coordinator_grace=shared.DRIVER_GRACE if settings.detach else None)
            warning = settings.stop_before_time_limit or (
                _REQUEUE_WARNING if settings.requeue else None)
            spec_paths = {step.index: growing.write_spec(supervision.packer, run_dir, step)
                          for step in steps}
            script_path = os.path.join(run_dir, 'job.sh')
            with open(script_path, 'w') as f:
                f.write(script.batch_script(
                    program.name, components, run_dir, spec_paths, detached=settings.detach,
                    restart_waits=growing.restart_waits(steps, policies),
                    warning_seconds=warning, growing=True, requeue=settings.requeue))
            if settings.detach:
                supervision.write()
            growing.adding_alive(run_dir)  # the job runs added nodes' steps while this is touched
            job_id = job.submit(script_path, program.name, batch_log, supervision.environment)
        except BaseException:
            if server is not None:
                server.Stop()
            raise
        if settings.detach:
            return _detached(job_id, supervision, len(steps), settings.start_timeout)
        print(f'Program {program.name!r} is Slurm job {job_id} ({len(steps)} nodes); node logs in '
              f'{log_dir}; cancel with scancel {job_id}.', file=sys.stderr, flush=True)
        try:  # lp.launch turns Ctrl-C and SIGTERM into KeyboardInterrupt while this waits
            _wait_for_start(job_id, run_dir, settings.start_timeout)
        except BaseException:
            job.cancel(job_id)
            server.Stop()
            raise
        closing = [server.Stop]
        if terminal == 'current_terminal':
            follower = LogFollower([('slurm', batch_log)] + [(s.executable.name, s.log)
                                                             for s in steps])
            closing = [follower.close, server.Stop]
        return supervision.controller(job_id, coordinator, watch_job=True, closing=closing)


@dataclasses.dataclass
class JobSupervision:
    """What supervises a program's job, and how to make it: its coordinator, and its step runner
    and controller. The launcher makes them for a program launched in the foreground; for a
    detached one, it writes this to the run directory (`write`), and the in-job driver reads it
    (`read`) and makes the same ones there, so a detached program grows, shrinks, scales and
    stops in graph order as any other.

    Attributes:
      program: the program (its elastic groups and scaling policy).
      launch_type, resources, notice_period: as given to `lp.launch`.
      policies: node name -> its restart policy and progress deadline.
      stop_order: who calls whom, for the stop in graph order.
      steps: the job's steps; components: the job's plan (for nodes added later).
      run_dir, log_dir, batch_log: the job's files.
      environment: the job's environment (the program's auth token in it).
      warning_seconds: when additional jobs' steps are warned before their time limit.
      requeue: the job may be requeued.
      auth_token: the token the program's nodes and coordinator require.
      packer: what packs a node added later into its spec.
      program_id: a detached program's id (its registry entry and run file, under RUNS).
      run_logs: the program's run directory's logs/, which links to each node's output file
        (`growing.link_log`); None if it could not be made.
    """
    program: Program
    launch_type: str
    resources: Dict[str, Any]
    notice_period: float
    policies: Dict[str, NodePolicy]
    stop_order: StopOrder
    steps: List[shared.WatchedStep]
    components: List[script.Component]
    run_dir: str
    log_dir: str
    batch_log: str
    environment: Dict[str, str]
    warning_seconds: Optional[int]
    requeue: bool
    auth_token: str
    packer: Optional[specs.Packer] = None
    program_id: Optional[str] = None
    run_logs: Optional[str] = None

    def coordinator(self) -> Coordinator:
        """The program's coordinator: its nodes, policies, groups and stop order."""
        return Coordinator([step.name for step in self.steps], policies=self.policies,
                           groups=self.program.group_limits(), stop_order=self.stop_order)

    def controller(self, job_id: str, coordinator: Coordinator, *, watch_job: bool,
                   closing: Sequence[Callable[[], None]],
                   runner_state: Optional[Dict[str, Any]] = None) -> SlurmController:
        """The controller of job `job_id`, with a step runner that can add nodes (see
        `StepRunner` for `watch_job` and `closing`), which takes over the steps of a dead
        driver's (its `runner_state`) if given."""
        runner = growing.GrowingStepRunner(
            job_id, self.run_dir, self.steps, coordinator, watch_job=watch_job, closing=closing,
            batch_log=self.batch_log, packer=self.packer, components=self.components,
            resources=self.resources, log_dir=self.log_dir, first_index=len(self.steps),
            program_name=self.program.name, environment=self.environment,
            warning_seconds=self.warning_seconds, requeue=self.requeue, run_logs=self.run_logs)
        if runner_state is not None:
            runner.restore(runner_state)
        return SlurmController(self.program.name, coordinator, runner,
                               launch_type=self.launch_type, notice_period=self.notice_period,
                               job_id=job_id, log_dir=self.log_dir, auth_token=self.auth_token)

    def write(self) -> None:
        """Writes this to the run directory, in a file only this user can read (it holds the
        program's token and TLS credentials)."""
        header = {'sys_path': [p for p in sys.path if p]}
        payload = specs.pickle_node(self.program.name, self)
        path = os.path.join(self.run_dir, shared.SUPERVISION_FILE)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), 'wb') as f:
            pickle.dump((header, payload), f, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def read(cls, run_dir: str) -> JobSupervision:
        """What the launcher wrote to `run_dir`, with the program's modules importable."""
        with open(os.path.join(run_dir, shared.SUPERVISION_FILE), 'rb') as f:
            header, payload = pickle.load(f)
        for entry in reversed(header['sys_path']):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        return pickle.loads(payload)


def _wait_for_start(job_id: str, run_dir: str, timeout: Optional[float]) -> None:
    """Waits until job `job_id` runs, keeping its added steps' loop alive meanwhile."""
    job.wait_for_start(job_id, timeout, ran=lambda: any(
        name.endswith(shared.EXIT_SUFFIX) for name in os.listdir(run_dir)),
        waiting=lambda: growing.adding_alive(run_dir))  # until the runner touches it


def _detached(job_id: str, supervision: JobSupervision, nodes: int,
              timeout: Optional[float]) -> SlurmAttachedController:
    """The controller of a detached program, once its driver serves it and every node runs
    (within `timeout` seconds, else the job is cancelled): it reaches the driver through a step
    of the job (`reach`), as `lp.attach` does."""
    run_dir, program = supervision.run_dir, supervision.program
    deadline = None if timeout is None else time.monotonic() + timeout
    entry = None
    try:  # lp.launch turns Ctrl-C and SIGTERM into KeyboardInterrupt while this waits
        _wait_for_start(job_id, run_dir, timeout)
        left = 60.0 if deadline is None else max(1.0, deadline - time.monotonic())
        entry = reach.adopt(run_dir, job_id, supervision.batch_log, left)
        controller = SlurmAttachedController(entry, supervision.log_dir)
        while not _all_started(controller):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f'The nodes of Slurm job {job_id} did not all start within '
                                   f'{timeout:g} s; see {supervision.log_dir}.')
            time.sleep(0.1)
    except BaseException:
        job.cancel(job_id)
        if entry is not None:
            registry.unregister(entry.id)
        raise
    print(f'Program {program.name!r} runs detached as Slurm job {job_id} ({nodes} nodes), '
          f'supervised in the job by pid {entry.pid} on {entry.host}; its id is {entry.id}; node '
          f'logs are in {supervision.log_dir}.\n{detached.commands(entry.id)}\n'
          f'  its history: python -m launchpad.launch sql {entry.id}\n'
          f'  or cancel:   scancel {job_id}', file=sys.stderr, flush=True)
    return controller


def _all_started(controller: SlurmAttachedController) -> bool:
    """Whether every node of the program has started (or the program has already ended);
    raises a node's failure."""
    try:
        states = {status.state for status in controller.status().values()}
    except detached.ProgramEndedError:
        return True  # (as quick a program as that ended well: a failure fails the job)
    if NodeState.FAILED in states:
        controller.wait()  # raises the node's failure
    return NodeState.PENDING not in states


def _spare_tasks(max_size: Optional[int], size: int, cap: Optional[int]) -> int:
    """The tasks the job reserves for an elastic group of `size` nodes to grow into."""
    room = max(0, (max_size or 0) - size)
    return room if cap is None else min(room, cap)


def _make_job_dir(base: Optional[str], program_name: str) -> str:
    """Makes a new job directory for `program_name` under `base` (or its default), with its
    private run/ and logs/ directories, and returns its path."""
    base = os.path.abspath(os.path.expanduser(
        base or os.environ.get(JOB_DIR_ENV) or os.path.join('~', 'launchpad_slurm')))
    if '%' in base:
        raise ValueError(f'The Slurm job directory {base!r} contains "%", which Slurm reads as a '
                         'file name pattern; choose another job_dir.')
    os.makedirs(base, exist_ok=True)
    stem = script.log_stem(program_name) or 'program'
    job_dir = tempfile.mkdtemp(prefix=f'{stem}-{time.strftime("%Y%m%d-%H%M%S")}-', dir=base)
    os.mkdir(os.path.join(job_dir, 'run'), 0o700)
    os.mkdir(os.path.join(job_dir, 'logs'), 0o700)
    return job_dir


def _job_environment(token: str) -> Dict[str, str]:
    """The environment sbatch passes to the job: ours (without a surrounding job's SLURM_
    variables), the program's auth token, unbuffered Python output, and the worker's supervising
    parent (without cgroups, Slurm loses track of what a killed node leaves)."""
    ours = {key: value for key, value in os.environ.items()
            if not key.startswith('SLURM_') or key == 'SLURM_CONF'}
    return specs.node_environment(token, base=ours, extra={specs.SUPERVISE_ENV: '1'})
