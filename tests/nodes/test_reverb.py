"""ReverbNode without dm-reverb, and the TCP-only addresses it relies on.

The Reverb server itself is tested in tests/reverb (its own environment: tests/reverb/run.sh).
"""
import socket
import sys

import pytest

import launchpad as lp
from launchpad import runtime
from launchpad.address import local_address_table
from launchpad.nodes.base import Handle, Node

from tests.nodes.conftest import LAUNCH_TYPES, launch_and_wait


def tables():
    return []


def test_without_reverb_the_node_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, 'reverb', None)  # what Python does for a missing module
    with pytest.raises(ImportError) as error:
        lp.ReverbNode(tables)
    message = str(error.value)
    assert "pip install 'launchpad-ml[reverb]'" in message
    assert 'dm-reverb' in message and 'tensorflow~=2.15.0' in message
    assert 'CPython 3.9, 3.10, 3.11' in message


class EchoHandle(Handle):
    def __init__(self, node, address):
        super().__init__(node)
        self._address = address

    def dereference(self):
        return runtime.get_context().address_table.resolve(self._address)


class TcpEchoNode(Node):
    """A server that, like Reverb's, can only listen on a TCP port."""

    def __init__(self):
        super().__init__()
        self._address = lp.Address('echo', tcp_only=True)
        self._addresses.append(self._address)

    def create_handle(self):
        return EchoHandle(self, self._address)

    def run_in_context(self):
        context = runtime.get_context()
        host, port = context.address_table.bind_target(self._address).rsplit(':', 1)
        with socket.create_server((host, int(port))) as server:
            server.settimeout(0.1)
            context.address_table.publish(self._address, f'{host}:{server.getsockname()[1]}')
            while not context.stop.event.is_set():
                try:
                    connection, _ = server.accept()
                except socket.timeout:
                    continue
                with connection:
                    connection.sendall(connection.recv(1024))


def call_echo(endpoint):
    host, port = endpoint.rsplit(':', 1)
    assert host == '127.0.0.1'
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(b'ping')
        assert connection.recv(1024) == b'ping'
    lp.stop()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_tcp_only_addresses_get_a_published_loopback_port(launch_type):
    program = lp.Program('tcp')
    echo = program.add_node(TcpEchoNode(), label='echo')
    program.add_node(lp.PyNode(call_echo, echo), label='caller')
    launch_and_wait(program, launch_type)


def test_local_tables_give_unix_sockets_to_other_addresses():
    plain, tcp = lp.Address('plain'), lp.Address('tcp', tcp_only=True)
    table = local_address_table([plain, tcp], '/private')
    assert table.bind_target(plain).startswith('unix:/private/')
    assert table.bind_target(tcp) == '127.0.0.1:0' and table.is_published(tcp)
