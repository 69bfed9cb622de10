"""A process that spoke gRPC can still start processes.

grpcio 1.80 (its last release for Python 3.9) makes about one child in ten abort between fork
and exec on Python 3.9, once gRPC has run in the parent (`epoll_wait error: Bad file descriptor`,
SIGABRT): every later subprocess, Slurm command or ssh of a launcher could die. pyproject.toml
keeps Python 3.9 on grpcio below 1.80; Python 3.10 and later start processes with vfork, which
runs none of gRPC's fork handlers.
"""
import subprocess
import sys

import pytest

import courier


@pytest.mark.grpc_only
def test_processes_started_after_a_grpc_call_start(server):
    assert courier.Client(server.address).add(1, 2) == 3  # gRPC ran in this process
    codes = [subprocess.run([sys.executable, '-c', 'pass'], capture_output=True,
                            check=False).returncode for _ in range(60)]
    assert codes == [0] * len(codes), f'children that died: {[c for c in codes if c]}'
