"""Fixtures for courier's tests: servers that are always stopped, leak checks."""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import pathlib
import time

import pytest

import courier
from tests.leftovers import no_new_children

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_SECONDS = 60


def pytest_collection_modifyitems(items):
    """Gives every courier test without its own timeout a default one: none may hang."""
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker('timeout') is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT_SECONDS))


@pytest.fixture(autouse=True)
def no_leaked_processes():
    """Fails a test that leaves a child process behind."""
    # multiprocessing's helper lives as long as this process by design: not a leak.
    multiprocessing.resource_tracker.ensure_running()
    with no_new_children(grace=0):
        yield


@pytest.fixture
def make_server():
    """Returns a factory of courier servers that are stopped after the test."""
    servers = []

    def make(*args, **kwargs) -> courier.Server:
        server = courier.Server(*args, **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.Stop()


@pytest.fixture
def server(make_server):
    """A started server with a few methods bound."""
    server = make_server()
    server.Bind('add', lambda x, y: x + y)
    server.Bind('echo', lambda *args, **kwargs: (args, kwargs) if kwargs or len(args) != 1
                else args[0])
    server.Bind('sleep', _sleep)
    server.Start()
    return server


def _sleep(seconds: float) -> str:
    time.sleep(seconds)
    return 'slept'


@pytest.fixture
def subprocess_env():
    """Environment for a child Python process that imports this checkout's courier."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')]))
    return {**os.environ, 'PYTHONPATH': path}
