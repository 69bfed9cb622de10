"""The floor plan of docs/architecture.md, checked: imports point down the layers, no module
imports itself in a circle, no platform imports another, no file grows past 650 lines, and
`import launchpad` / `import courier` load no more than they must."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from typing import Dict, Iterator, Set

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ('launchpad', 'courier')
MAX_LINES = 650

# Layers, lowest first: a module may import modules of its own layer or below, never above.
# The first prefix that matches a module name gives its layer (docs/architecture.md shows them).
LAYERS = [
    ('courier.transport._compat', 1),        # the CPython internals a call's future reaches into
    ('courier.transport._base', 1),          # transport interfaces, addresses, errors
    ('courier.transport.shm', 1),            # large buffers in shared memory (memfd) on one host
    ('courier.transport.same_host', 1),      # TCP clients on the server's host go on on Unix
    ('courier.transport.keepalive', 1),      # when a TCP connection's silent peer counts as dead
    ('courier.transport.frames', 2),         # the framed protocol's frames
    ('courier.transport.outbox', 2),         # frames many threads send on one socket
    ('courier.transport._here', 2),          # servers of this process, for in-process calls
    ('courier.transport.pool', 2),           # the framed server's bounded worker pool
    ('courier.transport.limits', 2),         # the framed server's limits
    ('courier.transport.loop', 2),           # the framed server's event loop
    ('courier.transport.tls', 2),            # TLS contexts, handshakes, sockets' locks (ssl)
    ('courier.transport.relay', 2),          # carries gRPC clients to a TCP server's gRPC service
    ('courier.transport.dial', 2),           # how a framed client connects and says hello
    ('courier.transport.framed_client', 3),  # the transports: never import each other
    ('courier.transport.framed_server', 3),
    ('courier.transport.grpc', 3),
    ('courier.transport.tcp', 4),            # a TCP address's lane: framed, else gRPC
    ('courier.transport', 4),                # picks a transport by address and protocol
    ('courier.resent', 4),                   # futures of calls a resolver re-sends
    ('courier.client', 5),
    ('courier.server', 5),
    ('courier.batching', 5),
    ('courier', 0),                          # the leaves (errors, wire, serialization, ...)
    ('launchpad.runtime', 10),
    ('launchpad.context', 10),  # launch types, and lp.context.get_context (from runtime)
    ('launchpad.dataflow', 10),              # dataflow operators: courier clients only
    ('launchpad.policy', 10),
    ('launchpad.resources', 10),             # lp.Resources, and what a node was given
    ('launchpad.scaling', 10),               # elastic groups' bounds, scaling policies
    ('launchpad.address', 11),
    ('launchpad.metrics', 11),               # what a node reports: lp.report, its calls
    ('launchpad.process', 12),
    ('launchpad.nodes', 13),
    ('launchpad.pool.results', 12),          # what a pool's callers wait on
    ('launchpad.pool.dispatch', 12),         # a pool's task table over courier clients
    ('launchpad.pool.worker', 13),           # the pool worker and its node
    ('launchpad.program', 14),
    ('launchpad.launch.runner', 15),         # what a platform implements for the controller
    ('launchpad.launch.controller', 15),
    ('launchpad.launch.elastic', 15),        # nodes joining and leaving a running program
    ('launchpad.observe.cli', 16),          # the commands looking at running programs
    ('launchpad.observe.inspect_cli', 16),  # ... and inside their nodes (stacks, waits, top)
    ('launchpad.observe.top', 16),
    ('launchpad.observe', 15),              # registry, observer, dashboard: lp.launch uses them
    ('launchpad.launch.launcher', 15),
    ('launchpad.launch.__main__', 17),
    ('launchpad.launch', 16),  # the platforms: threads, processes, ssh, slurm, kubernetes
    ('launchpad.pool', 17),    # lp.Pool launches its own program: beside the public face
    ('launchpad', 17),         # the package's public face
]
_TOP = {'courier': 6}  # a package's own __init__, above its modules

PLATFORMS = ('threads', 'processes', 'ssh', 'slurm', 'kubernetes')
TRANSPORTS = ('courier.transport.grpc', 'courier.transport.framed_client',
              'courier.transport.framed_server')


def _modules() -> Dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob('*.py'):
            parts = list(path.relative_to(REPO).with_suffix('').parts)
            if parts[-1] == '__init__':
                parts.pop()
            found['.'.join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> Iterator[str]:
    """The modules of ours that `name` imports, anywhere in it, except for type checking."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                base = '.'.join(package.split('.')[:len(package.split('.')) - node.level + 1]
                                + ([base] if base else []))
            targets = [f'{base}.{alias.name}' if f'{base}.{alias.name}' in MODULES else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition('.')[0]
            if target and target != name:
                yield target


GRAPH: Dict[str, Set[str]] = {name: set(_imports(name, path)) for name, path in MODULES.items()}


def _layer(name: str) -> int:
    if name in _TOP:
        return _TOP[name]
    return next(layer for prefix, layer in LAYERS if name == prefix or name.startswith(prefix + '.'))


def _platform(name: str) -> str:
    parts = name.split('.')
    return parts[2] if parts[:2] == ['launchpad', 'launch'] and len(parts) > 2 else ''


def test_every_import_points_down_the_layers():
    upward = [f'{name} (layer {_layer(name)}) imports {target} (layer {_layer(target)})'
              for name, targets in GRAPH.items() for target in targets
              if _layer(target) > _layer(name)]
    assert not upward


def test_no_platform_imports_another():
    crossing = [f'{name} imports {target}' for name, targets in GRAPH.items()
                for target in targets
                if _platform(name) in PLATFORMS and _platform(target) in PLATFORMS
                and _platform(name) != _platform(target)]
    assert not crossing


def test_no_transport_imports_another():
    crossing = [f'{name} imports {target}' for name in TRANSPORTS for target in GRAPH[name]
                if target in TRANSPORTS]
    assert not crossing


def test_there_is_no_import_circle():
    circles = []
    state: Dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list) -> None:
        state[name] = 1
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                circles.append(' -> '.join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert not circles


def test_no_file_is_longer_than_the_limit():
    long_files = {str(path.relative_to(REPO)): n for path in MODULES.values()
                  if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long_files


def _loaded_after(statement: str) -> Set[str]:
    code = f'import sys; {statement}; print(" ".join(sorted(sys.modules)))'
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          cwd=REPO, check=True)
    return set(done.stdout.split())


def test_import_launchpad_loads_no_platform_module():
    loaded = _loaded_after('import launchpad')
    assert not {m for m in loaded if m.startswith('launchpad.launch.')} - {
        'launchpad.launch.controller', 'launchpad.launch.elastic', 'launchpad.launch.launcher',
        'launchpad.launch.runner'}
    assert 'grpc' not in loaded


@pytest.mark.parametrize('name, module', [('SshHost', 'launchpad.launch.ssh'),
                                          ('SlurmResources', 'launchpad.launch.slurm'),
                                          ('KubernetesResources', 'launchpad.launch.kubernetes'),
                                          ('PythonProcess', 'launchpad.launch.processes')])
def test_a_platform_loads_when_one_of_its_names_is_used(name, module):
    loaded = _loaded_after(f'import launchpad; launchpad.{name}')
    assert module in loaded
    others = {m for m in loaded if _platform(m) in PLATFORMS and not m.startswith(module)}
    assert not others
