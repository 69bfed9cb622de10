"""How courier's modules depend on each other: grpc only where needed, no import circles."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from typing import Dict, Set

COURIER = pathlib.Path(__file__).resolve().parents[2] / 'courier'
TRANSPORTS = ('courier.transport.grpc', 'courier.transport.framed_client',
              'courier.transport.framed_server')

_GRPC_SCRIPT = '''
import os, sys, tempfile
import courier
print('grpc' in sys.modules)
directory = tempfile.mkdtemp(prefix='courier-')
server = courier.Server(address=f'unix:{directory}/s')
server.Bind('add', lambda x, y: x + y)
server.Start()
client = courier.Client(server.address, call_timeout=30)
assert client.add(1, 2) == 3 and client.futures.add(3, 4).result() == 7
assert courier.list_methods(client) == ['add']
server.Stop()
print('grpc' in sys.modules)
server = courier.Server()
server.Stop()
print('grpc' in sys.modules)
'''


def test_grpc_is_imported_only_for_tcp_addresses(subprocess_env):
    result = subprocess.run([sys.executable, '-c', _GRPC_SCRIPT], capture_output=True,
                            text=True, timeout=60, check=False, env=subprocess_env)
    assert result.returncode == 0, result.stderr
    # After `import courier`, after a unix: server and its clients, after a TCP server.
    assert result.stdout.split() == ['False', 'False', 'True']


def _imports() -> Dict[str, Set[str]]:
    """Returns, per courier module, the courier modules it imports (in functions too)."""
    modules = {}
    for path in COURIER.rglob('*.py'):
        parts = path.relative_to(COURIER.parent).with_suffix('').parts
        modules['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                targets = [f'{node.module}.{alias.name}'
                           if f'{node.module}.{alias.name}' in modules else node.module
                           for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def test_transports_never_import_each_other():
    graph = _imports()
    for transport in TRANSPORTS:
        assert not graph[transport] & set(TRANSPORTS), transport


def test_courier_has_no_import_circle():
    graph = _imports()

    def reaches(start: str, goal: str, seen: Set[str]) -> bool:
        for module in graph[start] - seen:
            seen.add(module)
            if module == goal or reaches(module, goal, seen):
                return True
        return False

    assert [module for module in graph if reaches(module, module, set())] == []
