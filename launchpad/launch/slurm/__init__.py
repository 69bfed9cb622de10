"""The `slurm` platform: runs a program as one Slurm job in which every node is a job step.

One module per place the code runs (docs/slurm.md shows how they work together):

    launcher.py   the launching machine: SlurmLauncher, SlurmOptions, SlurmController; and
                  wherever the coordinator runs: JobSupervision
    log_follower.py  the launching machine: copies the steps' output to its stdout
    growing.py    wherever the coordinator runs: the step runner of nodes added while it runs
    resources.py  the launching machine: SlurmResources, as sbatch and srun options
    script.py     the launching machine: the job's plan and the batch script (which runs in the job)
    job.py        where the job is watched: sbatch, squeue, scancel, scontrol; SlurmError
    steps.py      where the coordinator runs (launching machine, or the driver): StepRunner
    driver.py     inside a detached job: `python -m launchpad.launch.slurm.driver RUN_DIR`
    reach.py      both: how the login node reaches a detached job's driver (a relay step)
    addresses.py  in every job step, and where the coordinator starts: the node address table
    shared.py     everywhere: the run directory's files and the names both sides share

The public names load on first use, from the module that defines them, so that a job step, which
imports this package to unpickle its address table, loads nothing of the launcher's side.
"""
import importlib
from typing import Any, List

# Public name -> the module of this package that defines it.
_DEFINED_IN = {
    'JOB_DIR_ENV': 'launcher',
    'SlurmController': 'launcher',
    'SlurmError': 'job',
    'SlurmLauncher': 'launcher',
    'SlurmOptions': 'launcher',
    'SlurmResources': 'resources',
}

__all__ = sorted(_DEFINED_IN)


def __getattr__(name: str) -> Any:
    if name not in _DEFINED_IN:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    return getattr(importlib.import_module(f'{__name__}.{_DEFINED_IN[name]}'), name)


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
