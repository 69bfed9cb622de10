"""Runs you can open after they end: each program's history in one SQLite file of its run directory.

A program's run directory is `<runs>/<program id>/`, where `<runs>` is `$LAUNCHPAD_RUNS_DIR`,
else `$XDG_DATA_HOME/launchpad/runs`, else `~/.local/share/launchpad/runs`. It holds `run.sqlite`
(and TensorBoard's event files, when `lp.launch(..., tensorboard_dir=...)` points there), and
`logs/`, the node logs of `terminal='output_to_files'` (`logs_directory`). The
observer of the program (in the launching process) hands each sample to a `RunWriter`, whose
thread writes it, so that no disk write holds up sampling, let alone the nodes; SQLite runs in WAL
mode, so `sql` and dashboards read while it writes. The tables (times are seconds since the
epoch):

    run          one row: id, name, launch_type, host, pid, started, ended (NULL while it runs),
                 stop_reason, nodes and edges (JSON lists), last_view (JSON: the latest node and
                 edge rows, as `status --json` shows them)
    node_states  time, node, state, host, pid, restarts, error: a row each time a node's state,
                 pid or restart count changes
    failures     time, node, attempt (1, 2, ... per node), message, traceback
    restarts     time, node, restart (1, 2, ...): when the node was started again
    metrics      time, node, name, kind, value: every sample's CPU %, memory and call rates of
                 each node (kind 'gauge', names launchpad_cpu_percent, launchpad_rss_bytes,
                 launchpad_threads, launchpad_calls_per_s, launchpad_errors_per_s), and each
                 value a node reported anew (kind 'gauge' for lp.report, 'counter' for lp.count:
                 the running total)
    metrics_10s  the same, one row per series and 10 s slice (its last time; the mean of a
                 gauge, a counter's last total), which views of long runs read
    scaling      time, group_label, size, wanted, target, reason, spent: the scaling log
                 (`controller.scaling_log`; time is seconds since the program started)

`python -m launchpad.launch sql RUN "SELECT ..."` queries it; `runs`, `find` and `forget` list,
find and remove run directories (`list --all`, `forget RUN`).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sqlite3
import threading
from typing import Any, Dict, Iterable, List, Optional, Tuple

from launchpad.process import logs
from launchpad.process import output

ENV = 'LAUNCHPAD_RUNS_DIR'
FILE = 'run.sqlite'
LOGS = 'logs'  # the run directory's folder of node logs
LOGS_ENV = 'LAUNCHPAD_LOGGING_DIR'  # puts them elsewhere (`logs_directory`)
SCHEMA_VERSION = 1

SCHEMA = '''
CREATE TABLE IF NOT EXISTS run (id TEXT PRIMARY KEY, name TEXT, launch_type TEXT, host TEXT,
    pid INTEGER, started REAL, ended REAL, stop_reason TEXT, nodes TEXT, edges TEXT,
    last_view TEXT);
CREATE TABLE IF NOT EXISTS node_states (time REAL, node TEXT, state TEXT, host TEXT, pid INTEGER,
    restarts INTEGER, error TEXT);
CREATE TABLE IF NOT EXISTS failures (time REAL, node TEXT, attempt INTEGER, message TEXT,
    traceback TEXT);
CREATE TABLE IF NOT EXISTS restarts (time REAL, node TEXT, restart INTEGER);
CREATE TABLE IF NOT EXISTS metrics (time REAL, node TEXT, name TEXT, kind TEXT, value REAL);
CREATE INDEX IF NOT EXISTS metrics_by_time ON metrics (time);
CREATE TABLE IF NOT EXISTS metrics_10s (time REAL, node TEXT, name TEXT, kind TEXT, value REAL);
CREATE INDEX IF NOT EXISTS metrics_10s_by_time ON metrics_10s (time);
CREATE TABLE IF NOT EXISTS scaling (time REAL, group_label TEXT, size INTEGER, wanted INTEGER,
    target INTEGER, reason TEXT, spent REAL);
'''

ROLLUP_SECONDS = 10.0  # the slices of metrics_10s, read for views coarser than that

# The numbers the observer adds for every node, as they are named in the metrics table.
NODE_METRICS = {'cpu_percent': 'launchpad_cpu_percent', 'rss_bytes': 'launchpad_rss_bytes',
                'threads': 'launchpad_threads', 'calls_per_s': 'launchpad_calls_per_s',
                'errors_per_s': 'launchpad_errors_per_s'}


class RunError(RuntimeError):
    """A run asked for is not there, or cannot be read or removed; the message says why."""


def runs_directory() -> pathlib.Path:
    """Where run directories go (see the module docstring)."""
    explicit = os.environ.get(ENV)
    if explicit:
        return pathlib.Path(explicit).expanduser()
    data = os.environ.get('XDG_DATA_HOME') or os.path.join(os.path.expanduser('~'), '.local',
                                                           'share')
    return pathlib.Path(data) / 'launchpad' / 'runs'


def logs_directory(program_id: str) -> pathlib.Path:
    """Makes and returns the directory of program `program_id`'s node logs (output to files):
    `<its run directory>/logs`, or `$LAUNCHPAD_LOGGING_DIR/<program id>` if that is set, which
    `<its run directory>/logs` then links to, so that `logs RUN` finds them beside the run file."""
    run_dir = runs_directory() / program_id
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    elsewhere = os.environ.get(LOGS_ENV)
    if not elsewhere:
        (run_dir / LOGS).mkdir(exist_ok=True)
        return run_dir / LOGS
    directory = pathlib.Path(elsewhere).expanduser().resolve() / program_id
    directory.mkdir(parents=True, exist_ok=True)
    if not (run_dir / LOGS).is_symlink():
        (run_dir / LOGS).symlink_to(directory, target_is_directory=True)
    return directory


def read_log(run_dir: pathlib.Path, nodes: List[str], node: Optional[str] = None,
             cursor: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """The lines `nodes` (or `node`) wrote to their logs in `run_dir`, as
    `observer.Observer.logs` answers.

    Raises:
      LookupError: no such node, or the run kept no logs (the message says why).
    """
    if node is not None:
        if node not in nodes:
            raise LookupError(f'the run has no node {node!r}; its nodes are {", ".join(nodes)}.')
        nodes = [node]
    if not (run_dir / LOGS).is_dir():
        raise LookupError(f'the run kept no node logs in {run_dir / LOGS}: they are kept there '
                          "when it is launched with terminal='output_to_files' (its failures' "
                          'tracebacks are kept in its run file: see the failures of a node).')
    lines: List[List[str]] = []
    positions = dict(cursor or {})
    for name in nodes:
        path = run_dir / LOGS / output.log_file_name(name)
        if path.exists():
            read, positions[name] = logs.read_file(str(path), (cursor or {}).get(name))
            lines.extend([name, line] for line in read)
    return {'lines': lines, 'cursor': positions}


def connect(path: pathlib.Path, *, write: bool = False) -> sqlite3.Connection:
    """A connection to the run file `path` (read-only unless `write`)."""
    if write:
        connection = sqlite3.connect(str(path), check_same_thread=False)
        connection.execute('PRAGMA journal_mode=WAL')
        connection.execute('PRAGMA synchronous=NORMAL')  # WAL: safe against a crash of ours
        connection.executescript(SCHEMA)
        connection.execute(f'PRAGMA user_version={SCHEMA_VERSION}')
        return connection
    if not path.exists():
        raise RunError(f'{path} is not there: the run was removed, or never kept.')
    connection = sqlite3.connect(f'{path.resolve().as_uri()}?mode=ro', uri=True,
                                 check_same_thread=False)
    connection.execute('PRAGMA query_only=1')
    return connection


class RunWriter:
    """Writes one program's samples to `<directory>/run.sqlite` (the `recorder` calls it from a
    thread of its own)."""

    def __init__(self, directory: pathlib.Path, describe: Dict[str, Any]):
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory = directory
        self._connection = connect(directory / FILE, write=True)
        with self._connection:
            self._connection.execute(
                'INSERT OR REPLACE INTO run (id, name, launch_type, host, pid, started, nodes, '
                'edges) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
                (describe['id'], describe['name'], describe['launch_type'], describe['host'],
                 describe['pid'], describe['started'], json.dumps(describe['nodes']),
                 json.dumps(describe['edges'])))
        # What is written already: a new supervisor re-adopting the program goes on from there.
        read = self._connection.execute
        self._states: Dict[str, Tuple[Any, ...]] = {  # (SQLite: the row of the max)
            row[0]: tuple(row[1:6]) for row in read(
                'SELECT node, state, host, pid, restarts, error, max(time) FROM node_states '
                'GROUP BY node')}
        self._failures: Dict[str, int] = dict(
            read('SELECT node, max(attempt) FROM failures GROUP BY node').fetchall())
        self._restarts: Dict[str, int] = dict(
            read('SELECT node, max(restart) FROM restarts GROUP BY node').fetchall())
        self._reported: Dict[Tuple[str, str], float] = {}  # (node, name) -> its report time
        self._scaling = read('SELECT count(*) FROM scaling').fetchone()[0]
        # (node, name, kind) -> [slice, sum, count, last time, last value] of its open slice
        self._slices: Dict[Tuple[str, str, str], List[Any]] = {}

    def write(self, samples: List[Dict[str, Any]]) -> None:
        """Writes samples (`recorder.Recorder.record`) in one transaction."""
        with self._connection:
            for sample in samples:
                self._write(sample)

    def close(self) -> None:
        """Closes the file, left as one file (no WAL beside it) for those who copy it, unless
        someone reads it now (the WAL then stays, as readable)."""
        with self._connection:
            self._roll_up([], close=True)
        try:
            self._connection.execute('PRAGMA journal_mode=DELETE')
        except sqlite3.OperationalError:  # 'database is locked' by a reader
            pass
        self._connection.close()

    def _write(self, sample: Dict[str, Any]) -> None:
        now, execute = sample['time'], self._connection.execute
        rows: List[Tuple[float, str, str, str, float]] = []  # of the metrics table
        for row in sample['nodes']:
            node = row['name']
            state = (row['state'], row['host'], row['pid'], row['restarts'], row['error'])
            if self._states.get(node) != state:
                self._states[node] = state
                execute('INSERT INTO node_states VALUES (?, ?, ?, ?, ?, ?, ?)', (now, node, *state))
            for restart in range(self._restarts.get(node, 0) + 1, row['restarts'] + 1):
                execute('INSERT INTO restarts VALUES (?, ?, ?)', (now, node, restart))
            self._restarts[node] = max(self._restarts.get(node, 0), row['restarts'])
            rows.extend((now, node, name, 'gauge', row[key]) for key, name in
                        NODE_METRICS.items() if row.get(key) is not None)
        for node, failures in sample.get('failures', {}).items():
            for attempt, (message, text) in enumerate(failures[self._failures.get(node, 0):],
                                                      self._failures.get(node, 0) + 1):
                execute('INSERT INTO failures VALUES (?, ?, ?, ?, ?)',
                        (now, node, attempt, message, text))
            self._failures[node] = max(self._failures.get(node, 0), len(failures))
        for node, reported in sample.get('values', {}).items():
            for name, (kind, value, taken) in reported.items():
                if self._reported.get((node, name)) != taken:
                    self._reported[(node, name)] = taken
                    rows.append((taken, node, name, kind, value))
        self._connection.executemany('INSERT INTO metrics VALUES (?, ?, ?, ?, ?)', rows)
        self._roll_up(rows)
        for decision in sample.get('scaling', [])[self._scaling:]:
            execute('INSERT INTO scaling VALUES (?, ?, ?, ?, ?, ?, ?)',
                    (decision.time, decision.group, decision.size, decision.wanted,
                     decision.target, decision.reason, decision.spent))
        self._scaling = max(self._scaling, len(sample.get('scaling', [])))
        view = {'time': now, 'ended': sample['ended'], 'stop_reason': sample['stop_reason'],
                'nodes': sample['nodes'], 'edges': sample['edges']}
        execute('UPDATE run SET last_view = ?, stop_reason = ?, ended = ?',
                (json.dumps(view), sample['stop_reason'], now if sample['ended'] else None))

    def _roll_up(self, rows: List[Tuple[float, str, str, str, float]], close: bool = False) -> None:
        """Adds metric rows to their open slices, writing to metrics_10s the slices they close
        (every open one, if `close`)."""
        closed = []
        for taken, node, name, kind, value in rows:
            number = int(taken // ROLLUP_SECONDS)
            open_slice = self._slices.get((node, name, kind))
            if open_slice is not None and open_slice[0] != number:
                closed.append(((node, name, kind), open_slice))
                open_slice = None
            if open_slice is None:
                self._slices[(node, name, kind)] = [number, value, 1, taken, value]
            else:
                open_slice[1:] = [open_slice[1] + value, open_slice[2] + 1, taken, value]
        if close:
            closed.extend(self._slices.items())
            self._slices.clear()
        self._connection.executemany('INSERT INTO metrics_10s VALUES (?, ?, ?, ?, ?)', [
            (last, node, name, kind, final if kind == 'counter' else total / count)
            for (node, name, kind), (_, total, count, last, final) in closed])


def read_series(connection: sqlite3.Connection, start: Optional[float] = None,
                end: Optional[float] = None, points: int = 600) -> Dict[str, Any]:
    """Every metric of the run between `start` and `end` (default: its whole history), at most
    about `points` per series: the mean of each slice of time for gauges, the last total for
    counters (0 points: every row). Slices of ROLLUP_SECONDS or more are read from
    metrics_10s (a mean of means, not weighted by the rows each holds).

    Returns {'start', 'end', 'series': [{'name', 'node', 'kind', 'points': [[time, value]]}]}.
    """
    if start is None:  # (min and max in one query would read the whole index)
        start = connection.execute('SELECT min(time) FROM metrics').fetchone()[0]
    if end is None:
        end = connection.execute('SELECT max(time) FROM metrics').fetchone()[0]
    result: Dict[str, Any] = {'start': start, 'end': end, 'series': []}
    if start is None or end is None:
        return result
    if points <= 0:
        rows = connection.execute(
            'SELECT name, node, kind, time, value FROM metrics WHERE time >= ? AND time <= ? '
            'ORDER BY time', (start, end))
    else:
        width = max((end - start) / points, 1e-6)
        table = 'metrics_10s' if width >= ROLLUP_SECONDS else 'metrics'
        rows = connection.execute(
            'SELECT name, node, kind, max(time), CASE kind WHEN \'counter\' THEN max(value) '
            f'ELSE avg(value) END FROM {table} WHERE time >= ? AND time <= ? '
            'GROUP BY name, node, kind, CAST((time - ?) / ? AS INTEGER) ORDER BY 4',
            (start, end, start, width))
    series: Dict[Tuple[str, str, str], List[List[float]]] = {}
    for name, node, kind, taken, value in rows:
        series.setdefault((name, node, kind), []).append([taken, value])
    result['series'] = [{'name': name, 'node': node, 'kind': kind, 'points': values}
                        for (name, node, kind), values in series.items()]
    return result


def read_failures(connection: sqlite3.Connection,
                  node: Optional[str] = None) -> List[Dict[str, Any]]:
    """The failures of the run (of `node` only, if given), oldest first: {'time', 'node',
    'attempt', 'message', 'traceback'}."""
    query = 'SELECT time, node, attempt, message, traceback FROM failures'
    rows = connection.execute(query + ' WHERE node = ? ORDER BY time' if node else
                              query + ' ORDER BY time', (node,) if node else ())
    return [dict(zip(('time', 'node', 'attempt', 'message', 'traceback'), row)) for row in rows]


def read_run(connection: sqlite3.Connection) -> Dict[str, Any]:
    """The run's row: id, name, launch_type, host, pid, started, ended, stop_reason, nodes,
    edges, last_view (the JSON columns decoded)."""
    cursor = connection.execute('SELECT * FROM run')
    row = cursor.fetchone()
    if row is None:
        raise RunError('the run file holds no run (it was made by something else).')
    run = dict(zip([column[0] for column in cursor.description], row))
    for column in ('nodes', 'edges', 'last_view'):
        run[column] = json.loads(run[column]) if run[column] else None
    return run


def runs() -> List[Dict[str, Any]]:
    """Every kept run, oldest first: its `read_run` row (no last_view) and 'directory'."""
    found = []
    root = runs_directory()
    for directory in sorted(root.iterdir()) if root.is_dir() else ():
        try:
            connection = connect(directory / FILE)
            try:
                run = read_run(connection)
            finally:
                connection.close()
        except (RunError, sqlite3.Error):
            continue
        run.pop('last_view')
        found.append({**run, 'directory': str(directory)})
    return sorted(found, key=lambda run: run['started'] or 0.0)


def find(query: str) -> pathlib.Path:
    """The run directory `query` names: a path to one, a run's id (or its start), or a program
    name (its latest run)."""
    path = pathlib.Path(query).expanduser()
    if (path / FILE).is_file():
        return path
    kept = runs()
    exact = [run for run in kept if run['id'] == query]
    matches = exact or [run for run in kept if run['name'] == query][-1:] or [
        run for run in kept if run['id'].startswith(query)]
    if len(matches) == 1:
        return pathlib.Path(matches[0]['directory'])
    if matches:
        raise RunError(f'{len(matches)} runs match {query!r}: '
                       f'{", ".join(run["id"] for run in matches)}; name one by its id.')
    raise RunError(f'no kept run is named {query!r} or has that id in {runs_directory()} (see '
                   f'`python -m launchpad.launch list --all`; ${ENV} says where runs are kept).')


def forget(directory: pathlib.Path, running_ids: Iterable[str]) -> Dict[str, Any]:
    """Removes the run directory `directory`, unless its program still runs; returns its run."""
    connection = connect(directory / FILE)
    try:
        run = read_run(connection)
    finally:
        connection.close()
    if run['id'] in set(running_ids):
        raise RunError(f'program {run["name"]} ({run["id"]}) is still running; stop it first '
                       f'(`python -m launchpad.launch stop {run["id"]}`).')
    shutil.rmtree(directory)
    return run


class StoredRun:
    """A kept run answering what a dashboard asks an observer (`launchpad.observe.dashboard`),
    from its run file: `python -m launchpad.launch dashboard RUN` of a run that has ended."""

    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        self._connection = connect(directory / FILE)
        self._lock = threading.Lock()

    def _read(self, function, *args) -> Any:
        with self._lock:
            return function(self._connection, *args)

    def describe(self) -> Dict[str, Any]:
        run = self._read(read_run)
        return {key: run[key] for key in ('id', 'name', 'launch_type', 'host', 'pid', 'started',
                                          'ended', 'nodes', 'edges')} | {
            'dashboard': None, 'run_dir': str(self.directory)}

    def view(self) -> Dict[str, Any]:
        run = self._read(read_run)
        return run['last_view'] or {'time': run['started'], 'ended': run['ended'] is not None,
                                    'stop_reason': run['stop_reason'], 'nodes': [], 'edges': []}

    def history(self, since: int = 0) -> Dict[str, Any]:
        del since
        return {'next': 0, 'samples': []}  # everything is in `series`

    def logs(self, node: Optional[str] = None,
             cursor: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
        return read_log(self.directory, self._read(read_run)['nodes'] or [], node, cursor)

    def series(self, start: Optional[float] = None, end: Optional[float] = None,
               points: int = 600) -> Dict[str, Any]:
        return self._read(read_series, start, end, points)

    def failures(self, node: Optional[str] = None) -> List[Dict[str, Any]]:
        return self._read(read_failures, node)

    def close(self) -> None:
        with self._lock:
            self._connection.close()
