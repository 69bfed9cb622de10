"""The job's plan (its components and steps) and the batch script that runs it.

Runs on the launching machine, which writes the script to the run directory; the script itself
runs inside the job, on its first node, where it starts every step with `srun` (and, for a
detached program, the in-job driver first).
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from launchpad.launch.slurm import reach, shared
from launchpad.launch.slurm.resources import SlurmResources
from launchpad.nodes.base import Executable
from launchpad.observe import registry
from launchpad.process import spec as specs

# What Slurm sends the steps before the time limit (`--signal`), and the worker turns into a stop.
WARNING_SIGNAL = 'SIGUSR1'


@dataclasses.dataclass
class Step:
    """One executable, run as one job step.

    Attributes:
      index: its place in the program's executables; names its spec and exit code files.
      executable: what it runs.
      resources: its group's resources.
      log: its output file.
    """
    index: int
    executable: Executable
    resources: SlurmResources
    log: str

    def watched(self) -> shared.WatchedStep:
        """The step as the step runner follows it."""
        return shared.WatchedStep(self.index, self.executable.name, self.log)


@dataclasses.dataclass
class Component:
    """One component of the job (of a heterogeneous job if there are several): steps that share
    the same job-level resources, and `spare` tasks reserved for nodes added while it runs (its
    elastic groups' room to grow)."""
    resources: SlurmResources
    steps: List[Step]
    spare: int = 0


def plan(executables: Sequence[Tuple[str, Executable]], resources: Mapping[str, Any],
         log_dir: str, spare: Optional[Mapping[str, int]] = None) -> List[Component]:
    """Job components in order of first appearance; groups asking for the same job-level
    resources share a component, which reserves `spare[label]` more tasks for each of its
    groups (elastic groups' room to grow within the job's allocation)."""
    components: Dict[Any, Component] = {}
    used_logs = set()
    spared = set()
    for index, (label, executable) in enumerate(executables):
        group = resources.get(label) or SlurmResources()
        key = component_key(label, group)
        if label not in spared:
            spared.add(label)
            components.setdefault(key, Component(group, [])).spare += (spare or {}).get(label, 0)
        log = log_stem(executable.name)
        if log in used_logs:
            log = f'{log}-{index}'
        used_logs.add(log)
        step = Step(index, executable, group, os.path.join(log_dir, log + '.out'))
        components.setdefault(key, Component(group, [])).steps.append(step)
    return list(components.values())


def component_key(label: str, group: SlurmResources) -> Any:
    """What groups of one component share: their job-level resources (or a group's own nodes)."""
    return tuple(group.sbatch_options()) if group.nodes is None else ('own component', label)


def step_command(step: Step, spec_path: str, het_group: Optional[int]) -> List[str]:
    """The `srun` arguments that run `step` (in heterogeneous component `het_group`, if any)."""
    python = step.resources.interpreter or sys.executable
    return ([f'--het-group={het_group}'] if het_group is not None else []) + [
        '--exact', '--ntasks=1', '--nodes=1', *step.resources.per_task_options(),
        f'--job-name={step.executable.name}', f'--output={step.log}', '--input=none',
        *specs.worker_argv(spec_path, python)]


def log_stem(node_name: str) -> str:
    """A node's name made safe for its log file's name."""
    return re.sub(r'[^A-Za-z0-9_.-]', '_', node_name)


def step_line(step: Step, spec_path: str, het_group: Optional[int], restart_wait: float) -> str:
    """The arguments of the batch script's `step` function that run `step`: its index, how long
    a failed run waits for a restart (in the script's 0.2 s ticks), and its `srun` arguments."""
    srun = step_command(step, spec_path, het_group)
    return f'{step.index} {int(restart_wait * 5)} {shlex.join(srun)}'


def batch_script(program_name: str, components: Sequence[Component], run_dir: str,
                 spec_paths: Mapping[int, str], detached: bool = False,
                 restart_waits: Optional[Mapping[int, float]] = None,
                 warning_seconds: Optional[int] = None, growing: bool = False,
                 requeue: bool = False) -> str:
    """The sbatch script: one component per `components`, one `srun` step per executable.

    Every step records its exit code in `run_dir` for the step runner. A step in
    `restart_waits` (index -> seconds) that fails then waits that long for the runner to ask for
    a restart (`shared.restart_file`), and runs again as a new job step in the same allocation.
    `warning_seconds` asks Slurm to send the steps SIGUSR1 that long before the time limit. A
    `detached` program's script first starts the in-job driver (driver.py), which serves the
    program's coordinator, and waits until it has written its address; the job then ends with the
    driver's exit code, once every step ended, removing the run directory and the driver's
    registry (`reach.runtime_dir`). A driver killed by a signal is replaced, at most
    `shared.DRIVER_RESTARTS` times, by one that re-adopts the steps (driver.py). A `growing`
    program's script also runs the steps of nodes added while it runs: the step runner writes each one's `step` line to `INDEX.add` in the run directory
    (`shared.add_file`), until it writes `shared.ADDING_ENDS` or stops touching
    `shared.ADDING_ALIVE` (the launcher died). A `requeue` job may be requeued (`--requeue`);
    its warning, `warning_seconds` before the time limit, goes to this script, which requeues the
    job (`scontrol requeue`) rather than letting the time limit end it; each of its runs first
    removes the exit codes of the run before.
    """
    lines = ['#!/bin/bash']
    for number, component in enumerate(components):
        if number:
            lines.append('#SBATCH hetjob')
        lines.append(f'#SBATCH --ntasks={len(component.steps) + component.spare}')
        lines += [f'#SBATCH {option}' for option in component.resources.sbatch_options()]
        if requeue and not number:
            lines.append('#SBATCH --requeue')
            if warning_seconds:
                lines.append(f'#SBATCH --signal=B:{WARNING_SIGNAL[3:]}@{warning_seconds}')
        elif warning_seconds and not requeue:
            lines.append(f'#SBATCH --signal={WARNING_SIGNAL[3:]}@{warning_seconds}')
    exit_file = f'$run/$index{shared.EXIT_SUFFIX}'
    restart = f'$run/$index{shared.RESTART_SUFFIX}'
    lines += [
        f'# Program {program_name!r}, written by the launchpad slurm launcher: every node runs as',
        '# a job step; each step writes its exit code to the run directory, and a failed step',
        '# with a restart policy runs again when the step runner asks for it: once for each',
        '# attempt it asks for (a new driver may ask again for one its dead predecessor asked).',
        f'run={shlex.quote(run_dir)}',
        'step() {  # INDEX RESTART_WAIT_TICKS SRUN_ARGUMENTS...',
        '  local index=$1 ticks=$2 code waited attempt=0 asked',
        '  shift 2',
        *([f'  [ -e "$run/$index{shared.ENDED_SUFFIX}" ] && return  # it ended before a requeue']
          if requeue else []),
        '  while :; do',
        '    srun "$@"',
        '    code=$?',
        f'    {{ echo "$code $attempt" >"{exit_file}.tmp" && mv "{exit_file}.tmp" '
        f'"{exit_file}"; }} 2>/dev/null',
        '    [ "$code" = 0 ] && return',
        '    waited=0',
        f'    until asked=$(cat "{restart}" 2>/dev/null) && [ "${{asked:-0}}" -gt "$attempt" ]; do',
        '      [ "$waited" -ge "$ticks" ] || [ ! -d "$run" ] && return',
        '      sleep 0.2',
        '      waited=$((waited + 1))',
        '    done',
        '    attempt=$asked',
        f'    rm -f "{restart}"',
        '  done',
        '}',
    ]
    if requeue:
        lines += [
            '# The time limit is near: the job is requeued (every step gets SIGTERM, its stop',
            '# handlers run) and runs again, with the checkpoints of this run.',
            f'trap \'scontrol requeue "$SLURM_JOB_ID"\' {WARNING_SIGNAL[3:]}',
            f'rm -f "$run"/*{shared.RESTART_SUFFIX} "$run"/*{shared.EXIT_SUFFIX}',
        ]
    if detached:
        lines += [
            f'runtime={reach.runtime_dir()}  # the driver\'s registry, this job\'s own',
            'start_driver() {',
            f'  {registry.ENV}="$runtime" {shlex.join(shared.driver_argv(run_dir))} &',
            '  driver=$!',
            '}',
            'start_driver',
            f'until [ -s "$run/{shared.COORDINATOR_FILE}" ]; do',
            '  kill -0 "$driver" 2>/dev/null || { echo "launchpad: the coordinator did not start" >&2; '
            'exit 1; }',
            '  sleep 0.1',
            'done',
        ]
    heterogeneous = len(components) > 1
    for number, component in enumerate(components):
        for step in component.steps:
            line = step_line(step, spec_paths[step.index], number if heterogeneous else None,
                             (restart_waits or {}).get(step.index, 0))
            lines.append(f'step {line} &')
    if growing:
        lines += [
            '# Steps of nodes added while the program runs, until the step runner says no more.',
            f'alive="$run/{shared.ADDING_ALIVE}"  # touched by the step runner while it runs',
            f'until [ -e "$run/{shared.ADDING_ENDS}" ] || [ ! -e "$alive" ] || '
            f'[ $(($(date +%s) - $(stat -c %Y "$alive"))) -gt {shared.ADDING_SILENCE} ]; do',
            f'  for added in "$run"/*{shared.ADD_SUFFIX}; do',
            '    [ -e "$added" ] || continue',
            '    line=$(cat "$added") && rm -f "$added" && eval "step $line" &',
            '  done',
            '  sleep 0.2',
            'done &',
        ]
    if detached:
        lines += [
            '# A driver killed by a signal is replaced: the new one re-adopts the running steps.',
            'replaced=0',
            'while wait "$driver"; status=$?; [ "$status" -gt 128 ] && '
            f'[ "$replaced" -lt {shared.DRIVER_RESTARTS} ] && [ -e "$run/{shared.STATE_FILE}" ]; do',
            '  echo "launchpad: the driver (pid $driver) was killed (exit status $status); '
            'starting another" >&2',
            '  replaced=$((replaced + 1))',
            '  start_driver',
            'done',
            '# A killed driver neither ended the added steps\' loop nor removed the run directory;',
            '# the nodes stop without their coordinator.',
            f'touch "$run/{shared.ADDING_ENDS}" 2>/dev/null',
            'wait',
            'rm -rf "$runtime" "$run"',
            'exit "$status"',
        ]
    elif requeue:
        lines.append('until wait; do :; done  # a trapped signal interrupts `wait`')
    else:
        lines.append('wait')
    return '\n'.join(lines) + '\n'
