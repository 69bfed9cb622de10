"""The committed generated code matches protos/courier.proto."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
GENERATED = ('courier_pb2.py', 'courier_pb2.pyi')
GRPC_TOOLS_VERSION = '1.76.0'  # Pinned in setup.py's test extra.


def test_generated_code_is_up_to_date(tmp_path):
    installed = importlib.metadata.version('grpcio-tools')
    assert installed == GRPC_TOOLS_VERSION, (
        f'grpcio-tools {installed} is installed but the generated code is made with '
        f'{GRPC_TOOLS_VERSION}: pip install grpcio-tools=={GRPC_TOOLS_VERSION}')
    # Same command as BUILD.md, into a temporary directory.
    result = subprocess.run(
        [sys.executable, '-m', 'grpc_tools.protoc', '-Iprotos', f'--python_out={tmp_path}',
         f'--pyi_out={tmp_path}', 'protos/courier.proto'],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    for name in GENERATED:
        fresh = (tmp_path / name).read_text()
        committed = (REPO / 'courier' / name).read_text()
        assert committed == fresh, (
            f'courier/{name} is stale: regenerate it as BUILD.md describes')
