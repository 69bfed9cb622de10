"""What a platform implements for a launched program's controller: a `Runner`, the launcher's view
of the executables it started and what the platform can do with them. Runners of processes
usually keep one `NodeProcess` per executable (`ProcessRunner`).
"""
from __future__ import annotations

import abc
from typing import Any, Callable, Dict, Optional, Protocol, Sequence

from launchpad.nodes.base import Executable
from launchpad.policy import NodePolicy


class NodeProcess(Protocol):
    """Something that runs one executable and can be polled and killed like `subprocess.Popen`."""

    def poll(self) -> Optional[int]:
        """The exit code once it ended (negative: killed by that signal), else None."""

    def kill(self) -> None:
        """Ends it at once, with whatever it started."""


class Runner(abc.ABC):
    """The platform side of a controller: the executables a launcher started.

    A platform must say how its executables are doing (`poll`) and end them (`kill`); the rest
    is what a platform may provide, with defaults for one that does not:

    * `release`: frees what the launch holds, once, at the end (default: nothing to free);
    * `restart`: starts a failed node again (default: it cannot, so a node's first failure is
      final, whatever its restart policy);
    * `output` and `last_output`: where node output goes, and the last lines a node printed,
      which explain an exit without a reported error (default: none kept here);
    * `check_add`, `add_executable` and `remove`: nodes added to and removed from the running
      program (`launchpad.launch.elastic`; default: none can be added, and a removed node learns
      it from the coordinator).

    The controller calls every method on its monitor thread, except `output`.
    """

    output: Optional[Any] = None  # a `launchpad.process.output.Output` with `read_log`, if kept

    @abc.abstractmethod
    def poll(self) -> Dict[str, Optional[int]]:
        """Executable name -> exit code (negative: killed by that signal), or None while it runs."""

    @abc.abstractmethod
    def kill(self, names: Sequence[str]) -> None:
        """Ends the named executables at once, with whatever they started."""

    def release(self) -> None:
        """Frees what the launch holds (temporary directories, servers); called once at the end."""

    def restart(self, name: str) -> None:
        """Starts the named executable again, as it was first started; its last run has ended.
        Raises, saying why, where that is impossible (NotImplementedError: never possible)."""
        raise NotImplementedError(f'{type(self).__name__} cannot restart nodes')

    def last_output(self, name: str) -> str:
        """The last lines executable `name` printed ('' if they are not kept here)."""
        del name
        return ''

    def check_add(self, label: str) -> None:
        """Raises, saying why, if no node can be added to group `label` now; called before the
        node is named, so that nothing changes when it cannot."""
        del label
        raise NotImplementedError('its runner cannot add nodes')

    def add_executable(self, label: str, executable: Executable, policy: NodePolicy) -> None:
        """Starts `executable`, a node added to group `label` of the running program, as the
        launch started the others."""
        del executable, policy
        self.check_add(label)

    def remove(self, name: str) -> None:
        """Node `name` leaves the running program: gives it the stop where its worker does not
        watch the coordinator, which tells it (default: the worker does)."""
        del name


class ProcessRunner(Runner):
    """A `Runner` over one `NodeProcess` per executable; subclasses add what `release` frees.

    An executable started with `start(name, starter)` can be restarted: `restart` ends whatever
    is left of its last run (its children included) and calls `starter()` again.
    """

    def __init__(self):
        self.processes: Dict[str, NodeProcess] = {}
        self._starters: Dict[str, Callable[[], NodeProcess]] = {}

    def start(self, name: str, starter: Callable[[], NodeProcess]) -> None:
        """Starts executable `name` with `starter()`, which `restart` calls again."""
        self.processes[name] = starter()
        self._starters[name] = starter

    def poll(self) -> Dict[str, Optional[int]]:
        return {name: process.poll() for name, process in self.processes.items()}

    def kill(self, names: Sequence[str]) -> None:
        for name in names:
            self.processes[name].kill()

    def restart(self, name: str) -> None:
        starter = self._starters.get(name)
        if starter is None:
            raise RuntimeError(f'{type(self).__name__} cannot start {name} again')
        self.processes[name].kill()  # what its last run left behind, e.g. its children
        self.processes[name] = starter()

    def release(self) -> None:
        pass
