"""Keeps a program's samples beyond the observer's memory: in its run directory's SQLite file
(`runstore`) and, if asked, as TensorBoard event files (`tensorboard`).

The observer hands every sample to `Recorder.record`, which only queues it; the recorder's
thread writes queued samples in batches, so a slow disk holds up neither sampling nor nodes. A
writer that fails is dropped with a warning: the program goes on, unrecorded there.
"""
from __future__ import annotations

import logging
import pathlib
import queue
import sqlite3
import threading
from typing import Any, Dict, List, Optional

from launchpad.observe import runstore
from launchpad.observe import tensorboard


class Recorder:
    """Writes one program's samples to its run directory and, optionally, TensorBoard.

    Attributes:
      run_dir: the program's run directory (None if it could not be made).
      tensorboard_dir: where its event files go (None: none are written).
    """

    def __init__(self, describe: Dict[str, Any], tensorboard_dir: Optional[str] = None,
                 runs_dir: Optional[pathlib.Path] = None):
        """`runs_dir`: where run directories go (default: `runstore.runs_directory()`)."""
        self.run_dir: Optional[pathlib.Path] = None
        self.tensorboard_dir: Optional[str] = None
        self._writers: List[Any] = []
        directory = (runs_dir or runstore.runs_directory()) / describe['id']
        try:
            self._writers.append(runstore.RunWriter(directory, describe))
            self.run_dir = directory
        except (OSError, sqlite3.Error) as e:
            logging.warning('Program %r keeps no history in %s (`python -m launchpad.launch '
                            'sql` and the dashboard of the ended run will miss it): %s; set %s '
                            'to a directory of yours.', describe['name'], directory, e,
                            runstore.ENV)
        if tensorboard_dir is not None:
            writer = tensorboard.TensorBoardWriter(tensorboard_dir, describe)
            self._writers.append(writer)
            self.tensorboard_dir = writer.directory
        self._reader: Optional[sqlite3.Connection] = None
        self._reading = threading.Lock()
        self._queue: 'queue.Queue[Optional[Dict[str, Any]]]' = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True, name='lp-recorder')
        self._thread.start()

    def record(self, sample: Dict[str, Any]) -> None:
        """Queues one sample: {'time', 'nodes' (rows, with usage), 'edges', 'values' (as
        `figures.merge` gives them), 'failures' ({node: [(message, traceback)]}), 'scaling'
        (the controller's scaling log), 'ended', 'stop_reason'}."""
        self._queue.put(sample)

    def close(self) -> None:
        """Writes what is queued and closes the files (ours to read too, so that the run file
        is left whole; a dashboard reading it after opens it again)."""
        with self._reading:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _loop(self) -> None:
        closing = False
        while not closing:
            batch = [self._queue.get()]
            while batch[-1] is not None and not self._queue.empty():
                batch.append(self._queue.get())
            closing = batch[-1] is None
            samples = [sample for sample in batch if sample is not None]
            for writer in list(self._writers):
                try:
                    if samples:
                        writer.write(samples)
                    if closing:
                        writer.close()
                except Exception as e:  # pylint: disable=broad-except  (a full disk, ...)
                    logging.warning('Stopped recording the program in %s: %s',
                                    getattr(writer, 'directory', writer), e)
                    self._writers.remove(writer)

    # Reading back (the observer serves these to dashboards).

    def read(self, function, *args) -> Any:
        """`function(connection, *args)` over the run file (`runstore.read_series`, ...)."""
        if self.run_dir is None:
            raise LookupError('this program keeps no history: its run directory could not be '
                              'made (see the warning at its launch).')
        with self._reading:
            if self._reader is None:
                self._reader = runstore.connect(self.run_dir / runstore.FILE)
            return function(self._reader, *args)

