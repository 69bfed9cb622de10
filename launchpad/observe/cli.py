"""The commands that look at running programs from any shell of their user:

    python -m launchpad.launch list [--json]
    python -m launchpad.launch status PROGRAM [--json]
    python -m launchpad.launch logs PROGRAM [NODE] [--follow]   (or RUN: `runs_cli`)
    python -m launchpad.launch stop PROGRAM [--no-wait] [--timeout SECONDS]
    python -m launchpad.launch dashboard PROGRAM [--port PORT]
    python -m launchpad.launch metrics PROGRAM
    python -m launchpad.launch token PROGRAM
    python -m launchpad.launch list --all | sql RUN QUERY | forget RUN      (`runs_cli`)

(`stacks`, `waits` and `top` are `inspect_cli`'s, which shares this module's connection, errors
and tables.)

PROGRAM is a program's id (or the start of one) or its name, as `list` shows them. Each command
finds the program in the user's registry (`registry`) and calls its observer through courier
with the token of the registry entry (`observer`); nothing else is needed, and another user
can do none of it. `token` prints the auth token every call to one of the program's nodes
must carry (a gRPC client in another language sends it as `authorization: Bearer <token>`).
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import signal
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import courier

from launchpad.observe import inspect_text
from launchpad.observe import registry
from launchpad.observe import runs_cli
from launchpad.observe import runstore
from launchpad.observe import tunnel

COMMANDS = ('list', 'status', 'logs', 'stop', 'dashboard', 'metrics', 'token') + runs_cli.COMMANDS
_FOLLOW_INTERVAL = 0.5
_CALL_TIMEOUT = 30.0


class CommandError(RuntimeError):
    """A command cannot do what it was asked; its message says why and what to do."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m launchpad.launch',
        description='Look at the launchpad programs you are running on this machine.')
    commands = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')
    listing = commands.add_parser('list', help='the running programs')
    listing.add_argument('--json', action='store_true', help='print JSON')
    listing.add_argument('--all', action='store_true',
                         help='every kept run, ended ones too (`forget` removes one)')
    status = commands.add_parser('status', help="every node's state, host, pid, uptime, "
                                                'restarts, GPUs, cores, calls/s and last error')
    status.add_argument('program', help='id (or its start) or name of the program')
    status.add_argument('--json', action='store_true', help='print JSON')
    logs = commands.add_parser('logs', help="the nodes' output")
    logs.add_argument('program', help='id (or its start) or name of the program, or of an '
                                      "ended run (`list --all`) that wrote its logs to files")
    logs.add_argument('node', nargs='?', help="one node's name (default: every node's)")
    logs.add_argument('-f', '--follow', action='store_true',
                      help='keep printing new lines until the program ends')
    stop = commands.add_parser('stop', help='stop the program')
    stop.add_argument('program', help='id (or its start) or name of the program')
    stop.add_argument('--no-wait', action='store_true', help='return without waiting for it')
    stop.add_argument('--timeout', type=float, default=120.0,
                      help='seconds to wait for it to end (default 120)')
    dashboard = commands.add_parser('dashboard', help="serve the program's web dashboard here")
    dashboard.add_argument('program', help='id (or its start) or name of the program, or of '
                                           'an ended run (`list --all`)')
    dashboard.add_argument('--port', type=int, default=0, help='port on 127.0.0.1 (default: any)')
    metrics = commands.add_parser('metrics', help='print its metrics in the Prometheus format')
    metrics.add_argument('program', help='id (or its start) or name of the program')
    token = commands.add_parser('token', help="the auth token calls to the program's nodes "
                                              'carry (keep it secret)')
    token.add_argument('program', help='id (or its start) or name of the program')
    runs_cli.add_parsers(commands)
    return parser


def main(argv: Sequence[str]) -> int:
    """Runs one command; returns the exit status (errors are printed, not raised)."""
    args = _parser().parse_args(list(argv))
    return run(args.command, lambda: _COMMANDS[args.command](args))


def run(command: str, body: Callable[[], int]) -> int:
    """Runs `body`, the body of `command`; returns its exit status, printing its errors (the
    commands of `inspect_cli` run here too)."""
    try:
        return body()
    except (CommandError, registry.RegistryError, runstore.RunError) as e:
        print(f'python -m launchpad.launch {command}: {e}', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # its reader is gone (`... | head`): end as quietly as `cat` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is left in the buffer goes nowhere
        os.close(devnull)
        return 128 + signal.SIGPIPE


def _connect(query: str):
    """(registry entry, courier client of its observer) of the program `query` names."""
    entry = registry.find(query)
    client = tunnel.client_of(entry, _CALL_TIMEOUT)
    return tunnel.current(entry), client  # (a new supervisor's, if its tunnel found one)


def _call(entry: registry.Entry, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except courier.ServerUnavailableError as e:
        raise CommandError(f'program {entry.name} ({entry.id}) cannot be reached; it has '
                           f'probably just ended ({e}).') from e


def _list(args) -> int:
    if args.all:
        return runs_cli.list_all(args.json, _table)
    entries = registry.entries()
    if args.json:
        print(json.dumps([{k: v for k, v in vars(e).items() if k not in ('token', 'node_token')}
                          for e in entries],
                         indent=1))
        return 0
    if not entries:
        print('No launchpad program of yours is running on this machine.')
        return 0
    now = time.time()
    _table(['PROGRAM', 'ID', 'TYPE', 'NODES', 'UP', 'PID', 'DASHBOARD'],
           [[e.name, e.id, e.launch_type, e.nodes, _duration(now - e.started),
             _where(e), e.dashboard or '']
            for e in entries])
    return 0


def _where(entry: registry.Entry) -> str:
    """The PID column of `list`: a remote supervisor's host (and Slurm job) too."""
    if not registry.is_remote(entry):
        return str(entry.pid)
    return f'{entry.pid} on {entry.host}' + (f' (job {entry.job})' if entry.job else '')


def _status(args) -> int:
    entry, client = _connect(args.program)
    view = _call(entry, client.view)
    if args.json:
        print(json.dumps({'id': entry.id, 'name': entry.name, 'launch_type': entry.launch_type,
                          'controller': {'host': entry.host, 'pid': entry.pid,
                                         **({'job': entry.job} if entry.job else {})}, **view},
                         indent=1))
        return 0
    ended = f', ended ({view["stop_reason"]})' if view.get('ended') else ''
    how = ('detached, supervised' if entry.keeper_pid is not None else 'launched')
    print(f'{entry.name} ({entry.id}): {entry.launch_type}, {how} on {entry.host} by pid '
          f'{entry.pid} {_duration(time.time() - entry.started)} ago{ended}')
    _table(['NODE', 'STATE', 'HOST', 'PID', 'UPTIME', 'RESTARTS', 'GPUS', 'CORES', 'CALLS/S',
            'LAST ERROR'],
           [[row['name'], row['state'], row['host'] or '', row['pid'] or '',
             _duration(row['uptime']), row['restarts'], row.get('devices', ''),
             row.get('cores', ''), f'{row["calls_per_s"]:.1f}',
             (row['error'] or '').splitlines()[0] if row['error'] else '']
            for row in view['nodes']])
    return 0


def _logs(args) -> int:
    try:
        entry, client = _connect(args.program)
    except registry.RegistryError:
        ended = runs_cli.kept_run(args.program)
        if ended is None:
            raise
        return runs_cli.logs_of_ended(ended, args.node)
    cursor: Optional[Dict[str, int]] = None
    while True:
        try:
            result = _call(entry, lambda: client.logs(args.node, cursor))
        except LookupError as e:
            raise CommandError(str(e)) from None
        except CommandError:
            if cursor is None:
                raise
            print(f'(program {entry.name} ended)', file=sys.stderr)
            return 0
        cursor = result['cursor']
        for node, line in result['lines']:
            print(line if args.node else f'[{node}] {line}')
        sys.stdout.flush()
        if not args.follow:
            return 0
        time.sleep(_FOLLOW_INTERVAL)


def _stop(args) -> int:
    entry, client = _connect(args.program)
    _call(entry, lambda: client.stop(_requester()))
    if args.no_wait:
        print(f'Stopping {entry.name} ({entry.id}).')
        return 0
    deadline = time.monotonic() + args.timeout
    while tunnel.running(entry):
        if time.monotonic() > deadline:
            raise CommandError(f'program {entry.name} ({entry.id}) is still running '
                               f'{args.timeout:g} s after the stop; its launcher kills nodes '
                               f'that outlive the notice period, see `status`.')
        time.sleep(0.2)
    print(f'Stopped {entry.name} ({entry.id}).')
    return 0


def _requester() -> str:
    """Who runs this command, as the launcher of the program it stops prints it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        user = f'uid {os.getuid()}'
    parts = [f'user {user}', f'pid {os.getpid()}', f'parent pid {os.getppid()}']
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        if stream is not None and stream.isatty():
            parts.append(f'terminal {os.ttyname(stream.fileno())}')
            break
    parts.append(f'host {socket.gethostname()}')
    return f'`python -m launchpad.launch stop` ({", ".join(parts)})'


def _dashboard(args) -> int:
    from launchpad.observe import dashboard  # pylint: disable=import-outside-toplevel
    try:
        dashboard.require()
    except ImportError as e:
        raise CommandError(str(e)) from None
    try:
        entry, client = _connect(args.program)
    except registry.RegistryError:
        ended = runs_cli.kept_run(args.program)
        if ended is None:  # (nor a kept run: why it is not running says more)
            raise
        return runs_cli.dashboard_of_ended(ended, args.port, dashboard)
    served = dashboard.Dashboard(client, port=args.port)
    print(f'Dashboard of {entry.name} ({entry.id}): {served.url}\n'
          f'It runs until the program ends or you press Ctrl-C.', flush=True)
    try:
        while tunnel.running(entry):
            time.sleep(1.0)
    finally:
        served.close()
    print(f'Program {entry.name} ({entry.id}) ended.')
    return 0


def _metrics(args) -> int:
    from launchpad.observe import dashboard, prometheus  # pylint: disable=import-outside-toplevel
    try:
        dashboard.require()
    except ImportError as e:
        raise CommandError(str(e)) from None
    entry, client = _connect(args.program)
    sys.stdout.write(prometheus.exposition(_call(entry, client.sample)).decode())
    return 0


def _token(args) -> int:
    entry = registry.find(args.program)
    if not entry.node_token:
        raise CommandError(f'launchpad made no auth token for the nodes of program {entry.name} '
                           f'({entry.id}, {entry.launch_type}): local_mt nodes require the '
                           f'{courier.AUTH_TOKEN_ENV} of the launching process, if it had one; '
                           f"on Kubernetes it is in the program's Secret <run>-token.")
    print(entry.node_token)
    return 0


_COMMANDS: Dict[str, Callable[[Any], int]] = {
    'list': _list, 'status': _status, 'logs': _logs, 'stop': _stop, 'dashboard': _dashboard,
    'metrics': _metrics, 'token': _token, **runs_cli.HANDLERS}


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return ''
    seconds = int(seconds)
    hours, minutes = seconds // 3600, seconds // 60 % 60
    if hours:
        return f'{hours}h{minutes:02d}m'
    return f'{minutes}m{seconds % 60:02d}s' if minutes else f'{seconds}s'


def _table(header: List[str], rows: List[List[Any]]) -> None:
    for line in inspect_text.table_lines(header, rows):
        print(line)
