"""Fixtures for the observe tests: a private registry per test, and no leftovers."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Iterator

import pytest

from launchpad.observe import registry
from tests.leftovers import no_new_children


@pytest.fixture
def runtime_dir(monkeypatch, tmp_path) -> Iterator[str]:
    """A registry of running programs of this test's own (a short path: sockets live in it),
    and a TMPDIR of its own; checks afterwards that every program left the registry, and that
    the test left no process and nothing in its TMPDIR."""
    del tmp_path  # made before TMPDIR changes, where pytest keeps it
    path = tempfile.mkdtemp(prefix='lpobs-')
    private_tmp = tempfile.mkdtemp(prefix='lpobs-tmp-')  # launches make their directories here
    monkeypatch.setenv(registry.ENV, path)
    monkeypatch.setenv('TMPDIR', private_tmp)
    monkeypatch.setattr(tempfile, 'tempdir', private_tmp)
    try:
        with no_new_children():
            yield path
        deadline = time.monotonic() + 10
        while os.listdir(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.listdir(path), f'programs left in the registry: {os.listdir(path)}'
        assert not os.listdir(private_tmp), f'left in TMPDIR: {os.listdir(private_tmp)}'
    finally:
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(private_tmp, ignore_errors=True)
