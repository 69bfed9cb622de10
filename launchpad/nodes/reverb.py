"""`ReverbNode`: a Reverb replay server built and served inside its own executable.

dm-reverb is optional (`pip install 'launchpad-ml[reverb]'`); it is imported only where the node
runs and where its handles are dereferenced.
"""
from __future__ import annotations

import importlib.util
import logging
import shutil
import sys
from typing import Any, Callable, Optional, Sequence

from launchpad import runtime
from launchpad.address import Address
from launchpad.nodes.base import Handle, Node
from launchpad.process import tempdirs

REVERB_PYTHONS = ((3, 9), (3, 10), (3, 11))  # CPython versions dm-reverb 0.14 has wheels for


def missing_reverb_message() -> Optional[str]:
    """Why Reverb cannot be used in this Python (what to install), or None if it can."""
    missing = [module for module in ('reverb', 'tensorflow') if not _importable(module)]
    if not missing:
        return None
    python = f'{sys.version_info[0]}.{sys.version_info[1]}'
    versions = ', '.join(f'{major}.{minor}' for major, minor in REVERB_PYTHONS)
    fix = ("install it with `pip install 'launchpad-ml[reverb]'` (dm-reverb>=0.14.0 with "
           'tensorflow~=2.15.0, which needs numpy<2)')
    if sys.version_info[:2] not in REVERB_PYTHONS:
        fix = (f'dm-reverb has wheels for CPython {versions} only, and this is Python {python}: '
               f'use one of those, then {fix}')
    else:
        fix = f'{fix}; dm-reverb has wheels for CPython {versions}'
    return (f'lp.ReverbNode needs dm-reverb and TensorFlow, but {" and ".join(missing)} cannot be '
            f'imported here: {fix}.')


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: the module is blocked in sys.modules
        return False


def _require_reverb() -> None:
    message = missing_reverb_message()
    if message is not None:
        raise ImportError(message)


class ReverbHandle(Handle):
    """A handle that dereferences into a `reverb.Client` of its node's server."""

    def __init__(self, node: 'ReverbNode', address: Address):
        super().__init__(node)
        self._address = address

    @property
    def address(self) -> Address:
        return self._address

    def dereference(self) -> Any:
        _require_reverb()
        import reverb  # pylint: disable=import-outside-toplevel
        return reverb.Client(runtime.get_context().address_table.resolve(self._address))


class ReverbNode(Node):
    """Builds Reverb tables where it runs and serves them until the program stops.

    Args:
      priority_tables_fn: called with no arguments inside the node; returns the `reverb.Table`s.
      checkpoint_ctor: called with no arguments inside the node; returns the Reverb checkpointer
        (e.g. `reverb.checkpointers.DefaultCheckpointer(path)`). Without it the server checkpoints
        into a temporary directory in the program's run directory, removed when the node ends
        or with the program (a node killed runs no `finally`).
      checkpoint_time_delta_minutes: if given, the server writes a checkpoint this often.

    Raises:
      ImportError: dm-reverb or TensorFlow is not installed (the message says what to install).
    """

    def __init__(self, priority_tables_fn: Callable[[], Sequence[Any]],
                 checkpoint_ctor: Optional[Callable[[], Any]] = None,
                 checkpoint_time_delta_minutes: Optional[float] = None):
        _require_reverb()
        super().__init__()
        if not callable(priority_tables_fn):
            raise TypeError(f'priority_tables_fn must be a callable returning reverb.Tables, got '
                            f'{priority_tables_fn!r}.')
        if checkpoint_ctor is not None and not callable(checkpoint_ctor):
            raise TypeError(f'checkpoint_ctor must be a callable returning a Reverb checkpointer, '
                            f'got {checkpoint_ctor!r}.')
        if checkpoint_time_delta_minutes is not None and not (
                isinstance(checkpoint_time_delta_minutes, (int, float))
                and checkpoint_time_delta_minutes > 0):
            raise ValueError('checkpoint_time_delta_minutes must be a number of minutes > 0, got '
                             f'{checkpoint_time_delta_minutes!r}.')
        self._priority_tables_fn = priority_tables_fn
        self._checkpoint_ctor = checkpoint_ctor
        self._checkpoint_time_delta_minutes = checkpoint_time_delta_minutes
        self._address = Address('reverb', tcp_only=True)  # Reverb listens on TCP ports only
        self._addresses.append(self._address)

    def create_handle(self) -> ReverbHandle:
        return ReverbHandle(self, self._address)

    def run_in_context(self) -> None:
        import reverb  # pylint: disable=import-outside-toplevel
        context = runtime.get_context()
        table = context.address_table
        host, port = table.bind_target(self._address).rsplit(':', 1)
        tables = self._priority_tables_fn()
        scratch = None
        if self._checkpoint_ctor is not None:
            checkpointer = self._checkpoint_ctor()
        else:
            scratch = tempdirs.make('reverb')
            checkpointer = reverb.checkpointers.DefaultCheckpointer(path=scratch)
        try:
            # Port 0 asks Reverb to choose one (it picks an unused port and reports it).
            server = reverb.Server(tables=list(tables), port=int(port) or None,
                                   checkpointer=checkpointer)
            try:
                table.publish(self._address, f'{host}:{server.port}')
                self._serve(server, context)
            finally:
                server.stop()
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def _serve(self, server: Any, context: runtime.NodeContext) -> None:
        if self._checkpoint_time_delta_minutes is None:
            context.stop.watched().wait()
            return
        interval = self._checkpoint_time_delta_minutes * 60
        client = server.localhost_client()
        while not context.stop.watched().wait(interval):
            path = client.checkpoint()
            logging.info('%s: Reverb checkpoint written to %s', context.node_name, path)
