"""Saving and restoring one object in the node's checkpoint directory, atomically.

    def run(self):
        state = lp.load_checkpoint(default={'step': 0})   # the last one saved, by any attempt
        lp.register_stop_handler(lambda: lp.save_checkpoint(state))
        ...

`lp.save_checkpoint(obj)` pickles `obj` (with cloudpickle) into `lp.get_context().checkpoint_dir`;
`lp.load_checkpoint()` returns the last object saved there, by this attempt of the node or an
earlier one. A save writes a temporary file in the same directory, flushes it to disk, renames it
over the previous checkpoint and flushes the directory: a crash, a SIGKILL or a power cut at any
moment leaves either the previous checkpoint or the new one, never a torn file.
"""
from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

from courier import serialization

from launchpad import runtime

_SUFFIX = '.pkl'


def _path(name: str) -> str:
    if not name or not isinstance(name, str) or os.sep in name or name in ('.', '..'):
        raise ValueError(f'A checkpoint name is a plain file name (no {os.sep!r}), got {name!r}.')
    return os.path.join(runtime.get_context().checkpoint_dir, name + _SUFFIX)


def save_checkpoint(obj: Any, name: str = 'checkpoint') -> str:
    """Saves `obj` as the node's checkpoint `name`, atomically; returns the file's path.

    Raises what pickling raises if `obj` cannot be pickled; the previous checkpoint stays.
    """
    path = _path(name)
    data = serialization.cloudpickle_dumps(obj)
    directory = os.path.dirname(path)
    fd, temporary = tempfile.mkstemp(prefix=f'.{name}.', suffix='.tmp', dir=directory)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)  # the rename itself survives a crash
    finally:
        os.close(directory_fd)
    return path


def load_checkpoint(default: Any = None, name: str = 'checkpoint') -> Any:
    """The object last saved as the node's checkpoint `name`, or `default` if none was."""
    try:
        with open(_path(name), 'rb') as f:
            return pickle.load(f)
    except FileNotFoundError:
        return default
