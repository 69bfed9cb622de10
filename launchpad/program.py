"""`Program`: the graph of nodes, their resource groups and the edges handles draw between them."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Any, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from launchpad import runtime
from launchpad.nodes.base import Handle, Node
from launchpad.nodes.group import GroupHandle
from launchpad.policy import NodePolicy, RestartPolicy, check_progress_deadline, check_restart
from launchpad.scaling import Elastic, ScalingPolicy


class ProgramError(ValueError):
    """The program graph is malformed."""


class Program:
    """A distributed program: nodes in named resource groups.

    Build it with `add_node` (inside `with program.group(label):` or with an explicit label), then
    hand it to `lp.launch`. Building a program has no side effects: objects are built where nodes run.

    Attributes:
      name: the program's name.
      launched: True once `lp.launch` has started it; from then on `add_node` adds the node to
        the running program (through its controller).
      scaling: (policy, interval) given by `set_scaling_policy`, or None.
    """

    def __init__(self, name: str = 'launchpad'):
        self.name = name
        self.launched = False
        self._groups: Dict[str, List[Node]] = {}
        self._current_group: Optional[str] = None
        self._policies: Dict[str, NodePolicy] = {}  # by group label, and by node name
        self.elastic_groups: Dict[str, Elastic] = {}
        self.scaling: Optional[Tuple[ScalingPolicy, float]] = None
        self.controller: Any = None  # the running program's controller, set by lp.launch

    @contextlib.contextmanager
    def group(self, label: str, *, restart: Optional[RestartPolicy] = None,
              progress_deadline: Optional[float] = None,
              elastic: Optional[Elastic] = None) -> Iterator[None]:
        """Adds the nodes added inside the block to the resource group `label`.

        Args:
          restart: what a failure of one of the group's nodes does (`lp.RestartPolicy`); by
            default it fails the program.
          progress_deadline: seconds a node of the group may go without progress
            (`lp.heartbeat()`, or serving a call) before it counts as hung and fails. Time its
            thread waits for a CPU or for a courier call's answer does not count
            (docs/failures.md, "What counts as silence").
          elastic: `lp.Elastic(make_node, min_size, max_size, budget)`: the group may grow and
            shrink while the program runs (`controller.resize`, `lp.resize`, a scaling policy).
        """
        if elastic is not None:
            if not isinstance(elastic, Elastic):
                raise ProgramError(f'group(elastic=...) takes an lp.Elastic, got {elastic!r}.')
            self.elastic_groups[label] = elastic
        if self._current_group is not None:
            raise ProgramError(f'group() cannot be nested: group({label!r}) inside group('
                               f'{self._current_group!r}). Close the outer group first.')
        _check_label(label)
        self._set_policy(label, f'group {label!r}', restart, progress_deadline)
        self._current_group = label
        try:
            yield
        finally:
            self._current_group = None

    def add_node(self, node: Node, label: Optional[str] = None, *,
                 restart: Optional[RestartPolicy] = None,
                 progress_deadline: Optional[float] = None) -> Handle:
        """Adds `node` to the group `label` (or the current group) and returns a handle to it.

        `restart` and `progress_deadline` override the group's (see `group`) for this node.
        Once the program runs, the node is added to the running program and starts at once
        (`Controller.add_node`).
        """
        if self.launched:
            if self.controller is None or restart is not None or progress_deadline is not None:
                raise ProgramError(
                    f'Program {self.name!r} was already launched and {node!r} cannot join it: '
                    + ('a node added to a running program takes its group\'s restart policy and '
                       'progress deadline; give them to the group before the launch.'
                       if self.controller is not None else
                       'its controller is gone. Add every node before lp.launch, or build and '
                       'launch another program for it.'))
            return self.controller.add_node(node, label or self._current_group)
        return self._add(node, label, restart, progress_deadline)

    def add_running_node(self, node: Node, label: Optional[str]) -> Handle:
        """Names `node` as the next node of group `label` of the running program (the
        controller starts it; see `launchpad.launch.elastic`)."""
        if label is None:
            raise ProgramError(f'A node added to a running program needs a group: pass label=... '
                               f'(its groups are {sorted(self._groups)}).')
        return self._add(node, label, None, None)

    def group_handle(self, label: str) -> GroupHandle:
        """A handle to the whole group `label`, as it grows and shrinks: inside a node it is an
        `lp.GroupClient` listing the live members, calling all or any of them."""
        _check_label(label)
        return GroupHandle(label)

    def group_limits(self) -> Dict[str, Elastic]:
        """Every group -> what resizing may make of it: its `lp.Elastic`, or `Elastic()` for a
        group that is not elastic (it may shrink, but has no node factory to grow)."""
        return {label: self.elastic_groups.get(label, Elastic())
                for label in [*self._groups, *self.elastic_groups]}

    def set_scaling_policy(self, policy: ScalingPolicy, interval: float = 1.0) -> None:
        """Has the launcher ask `policy(metrics, now, sizes)` every `interval` seconds for the
        sizes of the elastic groups (see `launchpad.scaling`)."""
        if not callable(policy):
            raise ProgramError(f'set_scaling_policy takes a function (metrics, now, sizes) -> '
                               f'{{group: size}}, got {policy!r}.')
        if not interval > 0:
            raise ProgramError(f'set_scaling_policy(interval=...) is seconds > 0, got '
                               f'{interval!r}.')
        self.scaling = (policy, float(interval))

    def _add(self, node: Node, label: Optional[str], restart: Optional[RestartPolicy],
             progress_deadline: Optional[float]) -> Handle:
        if not isinstance(node, Node):
            raise ProgramError(f'add_node takes a launchpad node (lp.PyNode, lp.CourierNode, ...), '
                               f'got {node!r}.')
        if label is None:
            label = self._current_group
            if label is None:
                raise ProgramError(f'Label should not be empty: {node!r} needs a group; call add_node inside '
                                   '`with program.group(label):` or pass label=...')
        elif self._current_group is not None and label != self._current_group:
            raise ProgramError(f'The given label does not match the current group: add_node(label='
                               f'{label!r}) inside group({self._current_group!r}); use one or '
                               'the other.')
        _check_label(label)
        if node.colocated_in is not None:
            raise ProgramError(f'{node!r} is already part of {node.colocated_in!r}; add only the '
                               'colocation node to the program, not the nodes inside it.')
        if node.name is not None:
            raise ProgramError(f'{node!r} was already added to a program; create a new node instead.')
        nodes = self._groups.get(label, [])
        name = f'{label}/{len(nodes)}'
        self._set_policy(name, f'node {name}', restart, progress_deadline)
        node.name, node.program_name = name, self.name
        self._groups.setdefault(label, nodes).append(node)
        return node.create_handle()

    def _set_policy(self, key: str, what: str, restart: Optional[RestartPolicy],
                    progress_deadline: Optional[float]) -> None:
        check_restart(restart)
        check_progress_deadline(progress_deadline)
        if restart is None and progress_deadline is None:
            return
        old = self._policies.get(key)
        new = NodePolicy(restart, progress_deadline)
        if old is not None and old != new:
            raise ProgramError(f'{what} already has restart={old.restart!r}, progress_deadline='
                               f'{old.progress_deadline!r}; give them once, where the group is '
                               'first opened.')
        self._policies[key] = new

    def policy_of(self, node_name: str) -> NodePolicy:
        """What a failure or a hang of node `node_name` does: its own policy, else its group's."""
        label = runtime.group_of(node_name)
        own = self._policies.get(node_name) or NodePolicy()
        group = self._policies.get(label) or NodePolicy()
        return NodePolicy(own.restart or group.restart,
                          own.progress_deadline or group.progress_deadline)

    @property
    def groups(self) -> Dict[str, List[Node]]:
        """Group label -> its nodes, in insertion order."""
        return self._groups

    def get_all_nodes(self) -> List[Node]:
        """Every node of the program, group by group."""
        return [node for nodes in self._groups.values() for node in nodes]

    def _nodes_by_id(self) -> Dict[str, Node]:
        found: Dict[str, Node] = {}
        pending = self.get_all_nodes()
        while pending:
            node = pending.pop()
            found[node.node_id] = node
            pending.extend(getattr(node, 'inner_nodes', ()))
        return found

    @property
    def edges(self) -> List[Tuple[Node, Node]]:
        """(node, user) pairs: `user` received a handle of `node`."""
        by_id = self._nodes_by_id()
        edges = []
        for user in by_id.values():
            for handle in user.input_handles:
                source = by_id.get(handle.node_id)
                if source is not None and (source, user) not in edges:
                    edges.append((source, user))
        return edges

    def calls(self, executables: Iterable[str]) -> Tuple[Dict[str, Set[str]], Dict[str, Set[str]]]:
        """Who calls whom, by executable name (of `executables`, e.g. 'g/0' or 'g/0+h/0'):
        (executable -> the executables whose handles its nodes hold, executable -> the labels
        of the groups whose `GroupHandle` they hold). The stop follows it
        (`launchpad.process.stop_order`)."""
        owner = {node: name for name in executables for node in name.split('+')}

        def executable_of(node: Node) -> Optional[str]:
            while node.colocated_in is not None:
                node = node.colocated_in
            return owner.get(node.name)

        calls: Dict[str, Set[str]] = {}
        group_calls: Dict[str, Set[str]] = {}
        for source, user in self.edges:
            caller, callee = executable_of(user), executable_of(source)
            if caller is not None and callee is not None and callee != caller:
                calls.setdefault(caller, set()).add(callee)
        for user in self._nodes_by_id().values():
            caller = executable_of(user)
            for handle in user.input_handles:
                if caller is not None and isinstance(handle, GroupHandle):
                    group_calls.setdefault(caller, set()).add(handle.label)
        return calls, group_calls

    def validate(self) -> None:
        """Raises ProgramError if the graph cannot be launched."""
        if not self._groups:
            raise ProgramError(f'Program {self.name!r} has no nodes; add some with add_node.')
        by_id = self._nodes_by_id()
        for user in by_id.values():
            for handle in user.input_handles:
                if isinstance(handle, GroupHandle):
                    if handle.label not in self._groups and handle.label not in self.elastic_groups:
                        raise ProgramError(
                            f'{user!r} received a handle of group {handle.label!r}, which program '
                            f'{self.name!r} does not have; its groups are {sorted(self._groups)}.')
                    continue
                if handle.node_id not in by_id:
                    raise ProgramError(self._foreign_handle(user, handle))

    def _foreign_handle(self, user: Node, handle: Handle) -> str:
        """Why `user` cannot have `handle` (of a node that is not in this program), and what to
        do instead."""
        who = f'Node {user.name!r} ({user!r}) of program {self.name!r}'
        if handle.program_name is None:
            return (f'{who} received a handle of {handle.node_name}, which is not in program '
                    f'{self.name!r} (nor in any other). Add that node with program.add_node(...) '
                    f'and pass the handle it returns.')
        other = (f'another program also named {self.name!r}' if handle.program_name == self.name
                 else f'program {handle.program_name!r}')
        return (f'{who} received a handle of node {handle.node_name!r} of {other}. Handles '
                f'connect the nodes of one program only (lp.launch([a, b]) runs programs side by '
                f'side, not wired): build both nodes in one program, or serve that node at an '
                f'address of your own (courier.Server) and call it with courier.Client(address).')

    def to_dot(self) -> str:
        """The program as Graphviz text: one cluster per group, one arrow per edge."""
        lines = [f'digraph {_quote(self.name)} {{', '  rankdir=LR;',
                 '  node [shape=box, style="rounded,filled", fillcolor="#eef2f8", '
                 'fontname="Helvetica"];',
                 '  graph [fontname="Helvetica", style=rounded, color="#b8bec8"];']
        for index, (label, nodes) in enumerate(self._groups.items()):
            lines.append(f'  subgraph cluster_{index} {{')
            lines.append(f'    label={_quote(label)};')
            for node in nodes:
                lines.append(f'    {_quote(node.name)} [label={_quote(f"{node.name}: {node!r}")}];')
            lines.append('  }')
        for source, user in self.edges:
            lines.append(f'  {_quote(source.name or source.node_id)} -> '
                         f'{_quote(user.name or user.node_id)};')
        lines.append('}')
        return '\n'.join(lines) + '\n'

    def draw(self, path: str, format: Optional[str] = None) -> str:  # pylint: disable=redefined-builtin
        """Renders `to_dot()` to the image file `path` with Graphviz's `dot`; returns `path`.

        Args:
          path: where to write, e.g. 'graph.svg' or 'graph.png'.
          format: any output format of `dot` (svg, png, pdf, ...); default: `path`'s suffix.

        Raises:
          FileNotFoundError: Graphviz is not installed (the message says how to install it).
          ValueError: `dot` refused the format (or the graph); its message is included.
        """
        format = format or os.path.splitext(path)[1].lstrip('.').lower()
        if not format:
            raise ValueError(f'program.draw({path!r}) cannot tell the image format: give the '
                             "file a suffix such as .svg or .png, or pass format='svg'.")
        dot = shutil.which('dot')
        if dot is None:
            raise FileNotFoundError(
                "program.draw renders with Graphviz's `dot` program, which is not on PATH: "
                'install Graphviz (Debian/Ubuntu: apt-get install graphviz; macOS: brew install '
                'graphviz; conda: conda install graphviz), or render program.to_dot() '
                'elsewhere.')
        done = subprocess.run([dot, f'-T{format}', '-o', path], input=self.to_dot().encode(),
                              capture_output=True, check=False)
        if done.returncode != 0:
            raise ValueError(f'Graphviz could not draw program {self.name!r} as {format!r}: '
                             f'{done.stderr.decode(errors="replace").strip()}')
        return path

    def __repr__(self) -> str:
        sizes = ', '.join(f'{label}: {len(nodes)}' for label, nodes in self._groups.items())
        return f'Program({self.name!r}, {{{sizes}}})'


def make_program(*nodes: Node, name: str = 'launchpad') -> Program:
    """A program with `nodes`, each in a group named after what it runs."""
    program = Program(name)
    for node in nodes:
        function = getattr(node, 'function', None)
        program.add_node(node, label=getattr(function, '__name__', None) or type(node).__name__)
    return program


def _check_label(label) -> None:
    if label == '':
        raise ProgramError('Label should not be empty: group labels are non-empty strings '
                           'without "/".')
    if not isinstance(label, str) or '/' in label:
        raise ProgramError(f'Group labels are non-empty strings without "/", got {label!r}.')


def _quote(text: str) -> str:
    return '"' + str(text).replace('\\', '\\\\').replace('"', '\\"') + '"'
