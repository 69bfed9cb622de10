"""`lp.Resources`: the CPUs, GPUs and memory each node of a group needs, on every launcher.

    lp.launch(program, launch_type='local_mp', resources={
        'learner': lp.Resources(gpus=1, cpus=4),
        'actor': lp.Resources(gpus=0.25, cpus=1),   # four actors share a device
    })

Slurm and Kubernetes turn it into their own requests. On local_mp and ssh the launcher hands
out the devices and cores of each host itself (`launchpad.process.devices`): a node gets a
`NodeResources`, which sets its `CUDA_VISIBLE_DEVICES` and thread counts and pins it to its
cores, and which it reads as `lp.get_context().resources`.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import re
from typing import Any, Dict, Optional, Tuple, Union

# The variables that name the GPUs a process may use (NVIDIA's, and AMD's HIP, which numbers
# devices as CUDA_VISIBLE_DEVICES does).
DEVICE_VARIABLES = ('CUDA_VISIBLE_DEVICES', 'HIP_VISIBLE_DEVICES')
# The usual thread-count variables of numerical libraries, read when they load.
THREAD_VARIABLES = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS',
                    'NUMEXPR_NUM_THREADS', 'VECLIB_MAXIMUM_THREADS')
_UNITS = {'': 1, 'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
_EPSILON = 1e-9


@dataclasses.dataclass(frozen=True)
class Resources:
    """What each node of a group needs; accepted by every launcher in `resources={group: ...}`.

    Attributes:
      cpus: whole CPU cores per node. local_mp and ssh pin each node to that many cores of its
        own and set `OMP_NUM_THREADS` and the like to it; None: no pinning.
      gpus: GPUs per node: a whole number, or a share of one device (0.25: four nodes share it;
        local_mp and ssh only). 0: the node sees no GPU (`CUDA_VISIBLE_DEVICES=''`); None: the
        launcher leaves the devices alone.
      memory: memory per node, in bytes or as '512M', '8G' (binary units; Slurm's and
        Kubernetes' requests; local_mp and ssh do not enforce it).
    """
    cpus: Optional[int] = None
    gpus: Optional[float] = None
    memory: Union[int, str, None] = None

    def __post_init__(self):
        if self.cpus is not None and (not isinstance(self.cpus, numbers.Integral)
                                      or isinstance(self.cpus, bool) or self.cpus < 1):
            raise ValueError(f'Resources(cpus={self.cpus!r}): give a whole number of cores >= 1.')
        if self.gpus is not None:
            if (not isinstance(self.gpus, numbers.Real) or isinstance(self.gpus, bool)
                    or self.gpus < 0):
                raise ValueError(f'Resources(gpus={self.gpus!r}): give a number of GPUs >= 0.')
            if self.gpus > 1 and abs(self.gpus - round(self.gpus)) > _EPSILON:
                raise ValueError(f'Resources(gpus={self.gpus!r}): more than one GPU must be a '
                                 'whole number (a share is below 1, e.g. 0.25).')
        if self.memory is not None:
            memory_bytes(self.memory)

    @property
    def whole_gpus(self) -> int:
        """Whole devices per node (0 for a share or none)."""
        return 0 if self.gpus is None or self.gpus < 1 else int(round(self.gpus))

    @property
    def gpu_share(self) -> float:
        """The share of one device per node, below 1 (0 for whole devices or none)."""
        return 0.0 if self.gpus is None or self.gpus >= 1 else float(self.gpus)

    def gpu_count(self, platform: str) -> int:
        """`gpus` as a whole number, for platforms that only allocate whole devices (a clear
        ValueError for a share)."""
        if self.gpu_share:
            raise ValueError(
                f'Resources(gpus={self.gpus}) asks for a share of a GPU, which {platform} does '
                'not allocate (only local_mp and ssh share devices): ask for gpus=1 and run the '
                'nodes that share it in one executable (lp.MultiThreadingColocation or '
                'lp.MultiProcessingColocation).')
        return self.whole_gpus

    def platform_fields(self, platform: str, *, cpus: str, gpus: str, memory: str,
                        mib: str) -> Dict[str, Any]:
        """This request as the fields of a platform's own type (`cpus`, `gpus`, `memory`: their
        names there; `mib`: its suffix of MiB), for platforms that allocate whole GPUs: with an
        `env` that hides every device from a node asking for none."""
        fields: Dict[str, Any] = {'env': {}}
        if self.cpus is not None:
            fields[cpus] = self.cpus
        if self.gpus is not None:
            fields[gpus] = self.gpu_count(platform)
        if self.gpus == 0:
            fields['env'] = dict.fromkeys(DEVICE_VARIABLES, '')
        if self.memory is not None:
            fields[memory] = f'{mebibytes(self.memory)}{mib}'
        return fields

    @property
    def memory_bytes(self) -> Optional[int]:
        """`memory` in bytes, or None."""
        return None if self.memory is None else memory_bytes(self.memory)


def memory_bytes(memory: Union[int, str]) -> int:
    """Bytes of a memory size given as an int or as '512M', '8G', '8Gi', '1.5GB' (binary)."""
    if isinstance(memory, numbers.Integral) and not isinstance(memory, bool) and memory > 0:
        return int(memory)
    match = re.fullmatch(r'(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B?)', str(memory).strip(),
                         re.IGNORECASE)
    if match is None or float(match[1]) <= 0:
        raise ValueError(f'Resources(memory={memory!r}): give bytes (an int > 0) or a size '
                         "like '512M' or '8G'.")
    return int(float(match[1]) * _UNITS[match[2].upper()])


def mebibytes(memory: Union[int, str]) -> int:
    """`memory` in whole MiB, rounded up (Slurm's and Kubernetes' unit here)."""
    return math.ceil(memory_bytes(memory) / _UNITS['M'])


@dataclasses.dataclass(frozen=True)
class NodeResources:
    """What one node was given where it runs (`lp.get_context().resources`).

    Attributes:
      requested: what its group asked for.
      host: the host it runs on.
      gpus: the devices it may use, as `CUDA_VISIBLE_DEVICES` names them (empty: none), or None
        where the launcher left the devices alone (`gpus=None`, or Slurm and Kubernetes, whose
        own variables say).
      gpu_share: the share of each of those devices it was given (1.0: whole devices).
      cores: the CPU cores it is pinned to, or None where it is not pinned.
    """
    requested: Resources
    host: str = ''
    gpus: Optional[Tuple[str, ...]] = None
    gpu_share: float = 1.0
    cores: Optional[Tuple[int, ...]] = None

    def environment(self) -> Dict[str, str]:
        """The variables the node's process starts with: its devices and thread counts."""
        env = {}
        if self.gpus is not None:
            env.update(dict.fromkeys(DEVICE_VARIABLES, ','.join(self.gpus)))
        if self.cores is not None:
            env.update(dict.fromkeys(THREAD_VARIABLES, str(len(self.cores))))
        return env

    def describe(self) -> Dict[str, str]:
        """{'devices': ..., 'cores': ...} as `status` and the dashboard show them ('' where the
        launcher left them alone)."""
        devices = '' if self.gpus is None else (','.join(self.gpus) or 'none')
        if devices and self.gpus and self.gpu_share < 1:
            devices += f' ({self.gpu_share:g} each)'
        return {'devices': devices, 'cores': '' if self.cores is None else _ranges(self.cores)}


def _ranges(cores: Tuple[int, ...]) -> str:
    """'0-3,6' for cores (0, 1, 2, 3, 6), as taskset writes them."""
    spans = []
    for core in sorted(cores):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ','.join(str(a) if a == b else f'{a}-{b}' for a, b in spans)
