"""`Program`: the graph of nodes, their resource groups and the edges handles draw between them."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Dict, Iterator, List, Optional, Tuple

from launchpad.nodes.base import Handle, Node


class ProgramError(ValueError):
    """The program graph is malformed."""


class Program:
    """A distributed program: nodes in named resource groups.

    Build it with `add_node` (inside `with program.group(label):` or with an explicit label), then
    hand it to `lp.launch`. Building a program has no side effects: objects are built where nodes run.
    """

    def __init__(self, name: str = 'launchpad'):
        self.name = name
        self._groups: Dict[str, List[Node]] = {}
        self._current_group: Optional[str] = None

    @contextlib.contextmanager
    def group(self, label: str) -> Iterator[None]:
        """Adds the nodes added inside the block to the resource group `label`."""
        if self._current_group is not None:
            raise ProgramError(f'Groups cannot be nested: group({label!r}) inside group('
                               f'{self._current_group!r}). Close the outer group first.')
        _check_label(label)
        self._current_group = label
        try:
            yield
        finally:
            self._current_group = None

    def add_node(self, node: Node, label: Optional[str] = None) -> Handle:
        """Adds `node` to the group `label` (or the current group) and returns a handle to it."""
        if not isinstance(node, Node):
            raise ProgramError(f'add_node takes a launchpad node (lp.PyNode, lp.CourierNode, ...), '
                               f'got {node!r}.')
        if label is None:
            label = self._current_group
            if label is None:
                raise ProgramError(f'{node!r} needs a group: call add_node inside '
                                   '`with program.group(label):` or pass label=...')
        elif self._current_group is not None and label != self._current_group:
            raise ProgramError(f'add_node(label={label!r}) inside group({self._current_group!r}): '
                               'use one or the other.')
        _check_label(label)
        if node.colocated_in is not None:
            raise ProgramError(f'{node!r} is already part of {node.colocated_in!r}; add only the '
                               'colocation node to the program, not the nodes inside it.')
        if node.name is not None:
            raise ProgramError(f'{node!r} was already added to a program; create a new node instead.')
        nodes = self._groups.setdefault(label, [])
        node.name = f'{label}/{len(nodes)}'
        nodes.append(node)
        return node.create_handle()

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

    def validate(self) -> None:
        """Raises ProgramError if the graph cannot be launched."""
        if not self._groups:
            raise ProgramError(f'Program {self.name!r} has no nodes; add some with add_node.')
        by_id = self._nodes_by_id()
        for user in by_id.values():
            for handle in user.input_handles:
                if handle.node_id not in by_id:
                    raise ProgramError(
                        f'{user!r} received a handle of {handle.node_id}, which is not in program '
                        f'{self.name!r}. Add that node with program.add_node(...) first.')

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
    if not isinstance(label, str) or not label or '/' in label:
        raise ProgramError(f'Group labels are non-empty strings without "/", got {label!r}.')


def _quote(text: str) -> str:
    return '"' + str(text).replace('\\', '\\\\').replace('"', '\\"') + '"'
