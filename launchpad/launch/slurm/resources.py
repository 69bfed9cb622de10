"""`SlurmResources`: what each node of a group gets on a Slurm cluster, as sbatch and srun options.

Written by the user (or made from an `lp.Resources` by `SlurmResources.from_resources`) and read
on the launching machine, where the launcher turns it into the batch script's options (see
script.py).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, List, Mapping, Optional, Sequence, Union

from launchpad.resources import Resources
_MEM_UNITS = {'K': 1 / 1024, 'M': 1, 'G': 1024, 'T': 1024 * 1024}


@dataclasses.dataclass(frozen=True)
class SlurmResources:
    """What each node (executable) of a group gets on a Slurm cluster, and where it runs.

    Attributes:
      cpus: CPUs per executable (`--cpus-per-task`).
      mem: memory per executable in Slurm's notation ('500M', '32G'); sent as `--mem-per-cpu`.
      gpus: GPUs per executable (`--gpus-per-task`), optionally of `gpu_type` ('a100' gives
        `--gpus-per-task=a100:1`). For clusters that only know generic resources, pass
        `extra_args=['--gres=gpu:1']` instead.
      gpu_type: the GPU model to ask for, or None for any.
      nodes: spread the group's executables over this many nodes (`--nodes`); such a group always
        gets a job component of its own.
      partition: the partition (`--partition`), or None for the cluster's default.
      time: the time limit (`--time`, e.g. '2:00:00'), or None for the partition's default.
      extra_args: more sbatch options for the group's component, e.g. ['--qos=high'].
      args: absl flag values for the group's processes, as {name: value} or ['--name=value'].
      env: environment variables for the group's processes.
      interpreter: the Python the steps run (default: the launcher's; it must exist on the nodes).
    """
    cpus: int = 1
    mem: Optional[str] = None
    gpus: int = 0
    gpu_type: Optional[str] = None
    nodes: Optional[int] = None
    partition: Optional[str] = None
    time: Optional[str] = None
    extra_args: Sequence[str] = ()
    args: Union[Mapping[str, object], Sequence[str], None] = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    interpreter: Optional[str] = None

    def __post_init__(self):
        for name in ('cpus', 'gpus', 'nodes'):
            value = getattr(self, name)
            minimum = 0 if name == 'gpus' else 1
            if value is None and name == 'nodes':
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f'SlurmResources({name}={value!r}): expected an int >= {minimum}.')
        if self.mem is not None:
            _megabytes(self.mem)
        if isinstance(self.extra_args, str):
            raise TypeError(f'SlurmResources(extra_args={self.extra_args!r}): pass a list of '
                            'options, e.g. ["--qos=high"].')
        object.__setattr__(self, 'extra_args', tuple(self.extra_args))
        for option in self.sbatch_options():
            if not option.startswith('-') or any(c.isspace() for c in option):
                raise ValueError(f'SlurmResources: {option!r} is not a valid sbatch option here: '
                                 'options start with "-" and contain no spaces or newlines '
                                 '(write "--qos=high", not "--qos high").')
        if self.gpu_type is not None and not self.gpus:
            raise ValueError(f'SlurmResources(gpu_type={self.gpu_type!r}) needs gpus >= 1.')

    @classmethod
    def from_resources(cls, resources: Resources, **fields: Any) -> 'SlurmResources':
        """The Slurm request of an `lp.Resources` (cpus, gpus and memory per executable), with
        `fields` of its own (partition, gpu_type, ...): what a group given `lp.Resources` gets."""
        own = resources.platform_fields('Slurm', cpus='cpus', gpus='gpus', memory='mem', mib='M')
        return cls(**{**own, **fields, 'env': {**own['env'], **fields.get('env', {})}})

    def per_task_options(self) -> List[str]:
        """The options that size one executable (CPUs, memory, GPUs).

        Both its job component (`#SBATCH`) and its job step (`srun`) get them, so that the step
        asks for exactly what the component holds for it.
        """
        options = [f'--cpus-per-task={self.cpus}']
        if self.mem is not None:
            options.append(f'--mem-per-cpu={math.ceil(_megabytes(self.mem) / self.cpus)}M')
        if self.gpus:
            kind = f'{self.gpu_type}:' if self.gpu_type else ''
            options.append(f'--gpus-per-task={kind}{self.gpus}')
        return options

    def sbatch_options(self) -> List[str]:
        """The `#SBATCH` options of a job component made of this group's executables.

        Everything but `--ntasks`, which counts the component's executables. Groups whose options
        are equal share one component.
        """
        options = self.per_task_options()
        if self.nodes is not None:
            options.append(f'--nodes={self.nodes}')
        if self.partition is not None:
            options.append(f'--partition={self.partition}')
        if self.time is not None:
            options.append(f'--time={self.time}')
        return options + list(self.extra_args)


def _megabytes(mem: str) -> float:
    match = re.fullmatch(r'(\d+(?:\.\d+)?)(?:([KMGT])B?)?', str(mem).strip(), re.IGNORECASE)
    if match is None:
        raise ValueError(f'SlurmResources(mem={mem!r}): write memory like "500M" or "32G".')
    return float(match[1]) * _MEM_UNITS[(match[2] or 'M').upper()]
