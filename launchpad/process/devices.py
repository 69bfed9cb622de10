"""The GPUs and cores of a host, handed out to its nodes (local_mp and ssh).

`Inventory.discover()` finds what a host has: its GPUs from `nvidia-smi -L`, or the launching
environment's `CUDA_VISIBLE_DEVICES` where it is set (it also limits what may be handed out), and
the cores this process may run on. An `Allocator` gives each node of the host a `NodeResources`:
whole GPUs disjoint from every other node's, shares packed onto the fewest devices, disjoint
cores. A node keeps what it was given across restarts; `release` frees a node's devices and
cores for the next node. `preflight` assigns every node of a launch before anything starts, and
raises `ResourceShortfallError` with every shortfall, per group and host.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from launchpad.resources import DEVICE_VARIABLES, NodeResources, Resources

_EPSILON = 1e-9


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The devices and cores of one host.

    Attributes:
      host: the host's name, as messages give it.
      gpus: its GPUs, as `CUDA_VISIBLE_DEVICES` names them.
      cores: the CPU cores nodes may be pinned to.
      source: where `gpus` came from ('nvidia-smi -L', a variable, or 'none found').
    """
    host: str
    gpus: Tuple[str, ...]
    cores: Tuple[int, ...]
    source: str

    @classmethod
    def discover(cls, host: str = 'localhost',
                 environ: Optional[Mapping[str, str]] = None) -> 'Inventory':
        """What this machine has, for processes started from `environ` (default: ours)."""
        environ = os.environ if environ is None else environ
        for variable in DEVICE_VARIABLES:
            if variable in environ:
                return cls(host, _split(environ[variable]), _cores(), variable)
        return cls(host, _nvidia_smi(), _cores(), 'nvidia-smi -L')

    def to_json(self) -> Dict[str, object]:
        return {'host': self.host, 'gpus': list(self.gpus), 'cores': list(self.cores),
                'source': self.source}

    @classmethod
    def from_json(cls, value: Mapping[str, object]) -> 'Inventory':
        return cls(str(value['host']), tuple(value['gpus']), tuple(value['cores']),
                   str(value['source']))


def _split(devices: str) -> Tuple[str, ...]:
    return tuple(device.strip() for device in devices.split(',') if device.strip())


def _cores() -> Tuple[int, ...]:
    if not hasattr(os, 'sched_getaffinity'):  # not Linux: every core (pinning is Linux's)
        return tuple(range(os.cpu_count() or 1))
    return tuple(sorted(os.sched_getaffinity(0)))


def _nvidia_smi() -> Tuple[str, ...]:
    """The indices of the GPUs `nvidia-smi -L` lists ('GPU 0: ...'), or none."""
    if shutil.which('nvidia-smi') is None:
        return ()
    try:
        listing = subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True,
                                 timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.split(':', 1)[0].split()[1] for line in listing.splitlines()
                 if line.startswith('GPU '))


class ResourceShortfallError(RuntimeError):
    """A program asks for more GPUs or cores than its hosts have; nothing was started.

    Attributes:
      shortfalls: (host, group, what is short) for each group and host that lacks something.
    """

    def __init__(self, shortfalls: Sequence[Tuple[str, str, str]]):
        self.shortfalls = list(shortfalls)
        lines = ['The program asks for more than its hosts have; nothing was started:']
        lines += [f'  {host}: group {group!r}: {short}' for host, group, short in shortfalls]
        lines.append('  fix: ask for fewer GPUs or cores per node (lp.Resources), fewer nodes, '
                     'or more hosts; CUDA_VISIBLE_DEVICES in the launching environment limits '
                     'the GPUs that may be handed out.')
        super().__init__('\n'.join(lines))


class Short(Exception):
    """A node finds too few free GPUs or cores (`kind`) on its host."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


class Allocator:
    """Hands out the GPUs and cores of one host to its nodes.

    Takes the host's `Inventory`, or a function that finds it when a node first asks for
    something (a launch without `lp.Resources` never runs `nvidia-smi`).
    """

    def __init__(self, inventory: Union[Inventory, Callable[[], Inventory]]):
        self._inventory = inventory
        self._given: Dict[str, NodeResources] = {}

    @property
    def inventory(self) -> Inventory:
        """What the host has."""
        if not isinstance(self._inventory, Inventory):
            self._inventory = self._inventory()
        return self._inventory

    def assign(self, name: str, requested: Resources) -> NodeResources:
        """What node `name` gets: what it got before if it had something (a restart), else free
        devices and cores; ResourceShortfallError if the host lacks them."""
        try:
            return self.take(name, requested)
        except Short as short:
            raise ResourceShortfallError([(self.inventory.host, name.split('/')[0],
                                           self.shortfall(short.kind, requested, 1))]) from None

    def take(self, name: str, requested: Resources) -> NodeResources:
        """`assign`, raising `Short` where the host lacks something."""
        if name in self._given:
            return self._given[name]
        gpus, share = self._gpus(requested)
        cores = None
        if requested.cpus is not None:
            taken = {core for given in self._given.values() for core in given.cores or ()}
            free = [core for core in self.inventory.cores if core not in taken]
            if len(free) < requested.cpus:
                raise Short('cores')
            cores = tuple(free[:requested.cpus])
        given = NodeResources(requested, self.inventory.host, gpus, share, cores)
        self._given[name] = given
        return given

    def _gpus(self, requested: Resources) -> Tuple[Optional[Tuple[str, ...]], float]:
        if requested.gpus is None:
            return None, 1.0
        use = self.use()
        if requested.gpu_share:
            share = requested.gpu_share
            fitting = [gpu for gpu in self.inventory.gpus if use[gpu] + share <= 1 + _EPSILON]
            if not fitting:
                raise Short('gpus')
            # Fill a device already shared before opening a free one.
            return (max(fitting, key=lambda gpu: (use[gpu] < 1 and use[gpu] > 0, use[gpu])),
                    ), share
        free = [gpu for gpu in self.inventory.gpus if use[gpu] <= _EPSILON]
        if len(free) < requested.whole_gpus:
            raise Short('gpus')
        return tuple(free[:requested.whole_gpus]), 1.0

    def use(self) -> Dict[str, float]:
        """Device -> the share of it that nodes hold."""
        use = dict.fromkeys(self.inventory.gpus, 0.0)
        for given in self._given.values():
            for gpu in given.gpus or ():
                use[gpu] = use.get(gpu, 0.0) + given.gpu_share
        return use

    def check(self, group: str, requested: Resources) -> None:
        """Raises ResourceShortfallError if one more node of `group` would not fit now."""
        probe = f'{group}/+'
        try:
            self.assign(probe, requested)
        finally:
            self.release(probe)

    def release(self, name: str) -> None:
        """Frees what node `name` holds (it left the program) for the next node."""
        self._given.pop(name, None)

    def release_ended(self, status: Mapping[str, Any]) -> None:
        """Frees what the nodes that ended for good hold (`status`: a controller's, node name
        -> `NodeStatus`): a removed node's devices go to the next node."""
        for name, node in status.items():
            if node.state.ended:
                self.release(name)

    def given(self, name: str) -> Optional[NodeResources]:
        """What node `name` holds, if anything."""
        return self._given.get(name)

    def shortfall(self, kind: str, requested: Resources, count: int) -> str:
        """What `count` nodes asking `requested` lack here (`kind`: 'gpus' or 'cores')."""
        inventory = self.inventory
        if kind == 'gpus':
            have = (f'{len(inventory.gpus)} GPU(s) ({",".join(inventory.gpus)}, from '
                    f'{inventory.source})' if inventory.gpus
                    else f'no GPU (none found by {inventory.source})')
            return (f'{count} node(s) asking gpus={requested.gpus:g} each find none free; the '
                    f'host has {have}, {sum(self.use().values()):g} of them given to other nodes')
        return (f'{count} node(s) asking cpus={requested.cpus} each find too few free cores; '
                f'the host has {len(inventory.cores)} core(s) for nodes, '
                f'{sum(len(g.cores or ()) for g in self._given.values())} of them given to '
                'other nodes')


def preflight(nodes: Sequence[Tuple[Allocator, str, Resources]]) -> None:
    """Assigns every node of a launch, (its host's allocator, its name, its request), before
    anything starts; ResourceShortfallError listing every group and host that lacks something."""
    short: Dict[Tuple[int, str, str], List] = {}
    for allocator, name, requested in nodes:
        try:
            allocator.take(name, requested)
        except Short as e:
            key = (id(allocator), name.split('/')[0], e.kind)
            short.setdefault(key, [allocator, requested, 0])[2] += 1
    if short:
        raise ResourceShortfallError(
            [(allocator.inventory.host, group, allocator.shortfall(kind, requested, count))
             for (_, group, kind), (allocator, requested, count) in short.items()])
