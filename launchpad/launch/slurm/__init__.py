"""The `slurm` platform: runs a program as one Slurm job in which every node is a job step.

The public names below load on first use, from the module that defines them.
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
