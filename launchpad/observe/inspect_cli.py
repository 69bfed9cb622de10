"""The commands that look inside a running program's nodes, live:

    python -m launchpad.launch stacks PROGRAM [NODE] [--json]
    python -m launchpad.launch waits PROGRAM [--json]

`stacks` prints the Python stack of every thread of every running node (or of NODE). The
program's observer asks the nodes through their coordinator (`launchpad.process.probe`); a node
that does not answer within half a second is shown with its last-known stacks and how long it
has been silent: a process stuck in C code with the GIL held cannot run the thread that answers.

`waits` prints the calls in flight between nodes (caller node and thread, callee node and
method, age), the calls each node serves now, and the deadlocks: cycles of nodes waiting on each
other (`launchpad.observe.waits`), oldest first.

`top` (`launchpad.observe.top`) shows the same live, refreshed every second. The rest of the
commands are `launchpad.observe.cli`'s, whose connection, errors and tables these share.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

import courier

from launchpad.observe import cli
from launchpad.observe import inspect_text as text
from launchpad.process import probe

COMMANDS = ('stacks', 'waits', 'top')


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='python -m launchpad.launch',
                                     description='Look inside the nodes of a running program.')
    commands = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')
    stacks = commands.add_parser('stacks', help='the Python stack of every thread of every node')
    stacks.add_argument('program', help='id (or its start) or name of the program')
    stacks.add_argument('node', nargs='?', help="one node's name (default: every node)")
    stacks.add_argument('--json', action='store_true', help='print JSON')
    waits = commands.add_parser('waits', help='the calls in flight between nodes, and deadlocks')
    waits.add_argument('program', help='id (or its start) or name of the program')
    waits.add_argument('--json', action='store_true', help='print JSON')
    top = commands.add_parser('top', help='a live view of the nodes, refreshed every second')
    top.add_argument('program', help='id (or its start) or name of the program')
    top.add_argument('--interval', type=float, default=1.0,
                     help='seconds between refreshes (default 1)')
    return parser


def main(argv: Sequence[str]) -> int:
    """Runs one command; returns the exit status (errors are printed, not raised)."""
    args = _parser().parse_args(list(argv))
    command = {'stacks': _stacks, 'waits': _waits, 'top': _top}[args.command]
    return cli.run(args.command, lambda: command(args))


def _asked(entry, call):
    """`call()`, its errors turned into the command's (a program gone, a node unknown)."""
    try:
        return cli._call(entry, call)  # pylint: disable=protected-access
    except LookupError as e:
        raise cli.CommandError(str(e)) from None
    except courier.UnknownMethodError:
        raise cli.CommandError(f'program {entry.name} ({entry.id}) was launched by a launchpad '
                               f'without live probes; relaunch it with this one.') from None


def _stacks(args) -> int:
    entry, client = cli._connect(args.program)  # pylint: disable=protected-access
    probed = _asked(entry, lambda: client.probe([probe.STACKS], args.node))
    if args.json:
        print(json.dumps(probed, indent=1))
        return 0
    print(text.stacks(probed, time.time()), end='')
    return 0


def _waits(args) -> int:
    entry, client = cli._connect(args.program)  # pylint: disable=protected-access
    result = _asked(entry, client.waits)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(text.waits(result), end='')
    return 0


def _top(args) -> int:
    from launchpad.observe import top  # pylint: disable=import-outside-toplevel  (curses)
    if not (sys.stdout.isatty() and sys.stdin.isatty()):
        raise cli.CommandError('top is a terminal program and needs one; for text, use status, '
                               'stacks or waits.')
    if not args.interval > 0:
        raise cli.CommandError(f'--interval must be a number of seconds > 0, not '
                               f'{args.interval:g}.')
    entry, client = cli._connect(args.program)  # pylint: disable=protected-access
    return _asked(entry, lambda: top.run(entry, client, interval=args.interval))
