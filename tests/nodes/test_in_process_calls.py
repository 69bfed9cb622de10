"""Nodes sharing a process (local_mt, thread colocation) call each other without a socket."""
import collections
import time

import psutil
import pytest

import launchpad as lp

from tests.nodes.conftest import launch_and_wait


class Store:
    """Keeps what it is given and hands out a list it owns."""

    def __init__(self):
        self.kept = None
        self.owned = [1, 2]

    def keep(self, value):
        self.kept = value

    def get_kept(self):
        return self.kept

    def get_owned(self):
        return self.owned


def _accepted_connections() -> int:
    """Unix sockets of this process accepted by a server: a socket path listed twice or more."""
    paths = collections.Counter(conn.laddr for conn in psutil.Process().net_connections('unix')
                                if conn.laddr and conn.laddr.endswith('.sock'))
    return sum(count - 1 for count in paths.values())


def call_and_check(store):
    value = {'list': [1, 2]}
    store.keep(value)
    value['list'].append(3)  # The server got a copy, not this object.
    assert store.get_kept() == {'list': [1, 2]}
    owned = store.get_owned()
    owned.append(3)  # The caller got a copy of the server's list.
    assert store.get_owned() == [1, 2]
    assert store.futures.get_owned().result(timeout=30) == [1, 2]
    # The client checked once that the server accepts connections (a connection made and closed
    # at once); a call through a socket would keep its connection open.
    deadline = time.monotonic() + 30
    while _accepted_connections() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _accepted_connections() == 0, 'a call went through a socket'
    lp.stop()


@pytest.mark.parametrize('launch_type, colocated', [('test_mt', False), ('test_mp', True)])
def test_nodes_in_one_process_call_each_other_without_sockets(launch_type, colocated):
    program = lp.Program('in_process')
    store_node = lp.CourierNode(Store)
    store = store_node.create_handle()
    caller = lp.PyNode(call_and_check, store)
    if colocated:  # Two nodes as threads of one local_mp process.
        program.add_node(lp.ColocationNode([store_node, caller], mode='threads'), label='colo')
    else:
        program.add_node(store_node, label='store')
        program.add_node(caller, label='caller')
    controller = launch_and_wait(program, launch_type)
    assert all(status.state == lp.NodeState.FINISHED
               for status in controller.status().values()), controller.status()
