"""The launch types, and the context of the running node (`lp.context`, as in dm-launchpad).

`lp.get_context().launch_type` is a `LaunchType` member for the built-in launch types (a registered
launch type of your own stays its name, a str). `LaunchType` is a str enum, so a member equals its
name: `context.launch_type == 'local_mp'` and `context.launch_type is LaunchType.LOCAL_MULTI_PROCESSING`
both hold, and `.value` gives the name.
"""
from __future__ import annotations

import enum
from typing import Union

from launchpad.runtime import NodeContext, get_context

__all__ = ['LaunchType', 'NodeContext', 'get_context', 'is_local_launch',
           'is_local_launch_or_test', 'launch_type_of']


class LaunchType(str, enum.Enum):
    """The built-in launch types; `lp.launch` also accepts any registered name."""
    LOCAL_MULTI_THREADING = 'local_mt'
    LOCAL_MULTI_PROCESSING = 'local_mp'
    TEST_MULTI_THREADING = 'test_mt'
    TEST_MULTI_PROCESSING = 'test_mp'
    SSH = 'ssh'
    SLURM = 'slurm'
    KUBERNETES = 'kubernetes'

    __hash__ = str.__hash__  # a member and its name are the same dictionary key

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


_LOCAL_TYPES = (LaunchType.LOCAL_MULTI_THREADING, LaunchType.LOCAL_MULTI_PROCESSING)
_TEST_TYPES = (LaunchType.TEST_MULTI_THREADING, LaunchType.TEST_MULTI_PROCESSING)


def launch_type_of(name: Union[str, LaunchType]) -> Union[str, LaunchType]:
    """The `LaunchType` member called `name`, or `name` itself for a launch type of your own."""
    try:
        return LaunchType(str(name))
    except ValueError:
        return str(name)


def is_local_launch(launch_type: Union[str, LaunchType]) -> bool:
    """True for launch types that run on this machine for real (local_mt, local_mp)."""
    return str(launch_type) in _LOCAL_TYPES


def is_local_launch_or_test(launch_type: Union[str, LaunchType]) -> bool:
    """True for local and test launch types."""
    return str(launch_type) in _LOCAL_TYPES + _TEST_TYPES
