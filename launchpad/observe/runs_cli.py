"""The commands on kept runs (`runstore`), running or ended:

    python -m launchpad.launch list --all [--json]
    python -m launchpad.launch sql RUN "SELECT ..." [--json]
    python -m launchpad.launch forget RUN
    python -m launchpad.launch dashboard RUN     (of an ended run: `cli` serves a live one)
    python -m launchpad.launch logs RUN [NODE]   (of an ended run, from its `logs/`: the same)

RUN is a run's id (or its start), a program's name (its latest run) or a run directory.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sqlite3
import time
from typing import Any, Callable, Dict, List, Optional

from launchpad.observe import registry
from launchpad.observe import runstore

COMMANDS = ('sql', 'forget')


def add_parsers(commands: argparse._SubParsersAction) -> None:  # pylint: disable=protected-access
    """Adds `sql` and `forget` to the CLI's commands."""
    sql = commands.add_parser('sql', help="query a run's history (running or ended) with SQL; "
                                          'tables: run, node_states, failures, restarts, metrics, '
                                          'metrics_10s, scaling (docs/runs.md)')
    sql.add_argument('run', help="id (or its start) or name of the run, or its directory")
    sql.add_argument('query', help='one SQL statement (the file is opened read-only)')
    sql.add_argument('--json', action='store_true', help='print JSON: a list of row objects')
    forget = commands.add_parser('forget', help="remove an ended run's directory")
    forget.add_argument('run', help="id (or its start) or name of the run, or its directory")


def list_all(as_json: bool, table: Callable[[List[str], List[List[Any]]], None]) -> int:
    """`list --all`: every kept run, running or ended, oldest first."""
    running = {entry.id for entry in registry.entries()}
    kept = runstore.runs()
    for run in kept:
        run['running'] = run['id'] in running
    if as_json:
        print(json.dumps(kept, indent=1))
        return 0
    if not kept:
        print(f'No run is kept in {runstore.runs_directory()}.')
        return 0
    table(['RUN', 'PROGRAM', 'TYPE', 'NODES', 'STARTED', 'LASTED', 'ENDED'],
          [[run['id'], run['name'], run['launch_type'], len(run['nodes'] or ()),
            _when(run['started']), _lasted(run), _how_ended(run)] for run in kept])
    return 0


def sql(args) -> int:
    """`sql RUN QUERY`: the rows of one read-only query, tab-separated under a header."""
    directory = runstore.find(args.run)
    connection = runstore.connect(directory / runstore.FILE)
    try:
        cursor = connection.execute(args.query)
        columns = [column[0] for column in cursor.description or ()]
        rows = cursor.fetchall()
    except sqlite3.Error as e:
        raise runstore.RunError(f'the query failed: {e} (the tables are described in '
                                f'docs/runs.md: run, node_states, failures, restarts, '
                                f'metrics, metrics_10s, scaling).') from None
    finally:
        connection.close()
    if args.json:
        print(json.dumps([dict(zip(columns, row)) for row in rows], indent=1))
        return 0
    if columns:
        print('\t'.join(columns))
    for row in rows:
        print('\t'.join('' if cell is None else str(cell) for cell in row))
    return 0


def forget(args) -> int:
    """`forget RUN`: removes the run directory of an ended run."""
    directory = runstore.find(args.run)
    run = runstore.forget(directory, [entry.id for entry in registry.entries()])
    print(f'Forgot run {run["id"]} of {run["name"]} ({directory} is removed).')
    return 0


HANDLERS: Dict[str, Callable[[Any], int]] = {'sql': sql, 'forget': forget}


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime('%Y-%m-%d %H:%M:%S')


def _lasted(run: Dict[str, Any]) -> str:
    lasted = int((run['ended'] or time.time()) - run['started'])
    return f'{lasted // 3600}h{lasted // 60 % 60:02d}m{lasted % 60:02d}s'


def _how_ended(run: Dict[str, Any]) -> str:
    if run['running']:
        return 'running'
    if run['ended'] is None:
        return 'launcher lost'  # its launching process died before it could say
    return run['stop_reason'] or 'every node ended'


def kept_run(query: str) -> Optional[pathlib.Path]:
    """The directory of the kept run `query` names (`runstore.find`), or None if there is none
    to be read."""
    try:
        return runstore.find(query)
    except (runstore.RunError, OSError):
        return None


def logs_of_ended(directory: pathlib.Path, node: Optional[str]) -> int:
    """`logs RUN [NODE]` of a run no running program has (in `directory`): what its nodes wrote
    to the files of its run directory's `logs/`, node after node."""
    source = runstore.StoredRun(directory)
    try:
        result = source.logs(node)
    except LookupError as e:
        raise runstore.RunError(str(e)) from None
    finally:
        source.close()
    for name, line in result['lines']:
        print(line if node else f'[{name}] {line}')
    return 0


def dashboard_of_ended(directory: pathlib.Path, port: int, dashboard) -> int:
    """`dashboard RUN` of a run no running program has (in `directory`): served from its run
    file on `port` until Ctrl-C."""
    source = runstore.StoredRun(directory)
    served = dashboard.Dashboard(source, port=port)
    run = source.describe()
    print(f'Dashboard of the run {run["id"]} of {run["name"]} (ended): {served.url}\n'
          f'It runs until you press Ctrl-C.', flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        served.close()
        source.close()
