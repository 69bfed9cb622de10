"""Runs a script that builds and launches a program, with the launch type chosen here; or looks
at running programs.

    python -m launchpad.launch --type=local_mp script.py [script args]
    python -m launchpad.launch list | status | logs | stop | dashboard | metrics | token ...
    python -m launchpad.launch stacks | waits | top ...
    python -m launchpad.launch attach [--recover] PROGRAM

The script runs as `__main__` with `sys.argv = [script.py, script args...]`; every `lp.launch` in it
without an explicit launch type uses `--type` (default: the script's own `--lp_launch_type` if its
arguments have one, else local_mp; the two must agree when both are given). The command waits for
the launched programs to end and exits non-zero, after printing the error, if a node failed. The
other commands are those of `launchpad.observe.cli` and `launchpad.observe.inspect_cli`, and
`attach`, which follows a detached program (`launchpad.launch.detached`).
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
from typing import List, Optional

from launchpad.launch import detached
from launchpad.launch import launcher
from launchpad.observe import cli
from launchpad.observe import inspect_cli
from launchpad.process.coordinator import NodeFailedError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m launchpad.launch',
        description='Run a launchpad program script with the given launch type.',
        epilog=f'To look at running programs: python -m launchpad.launch '
               f'{{{",".join(cli.COMMANDS + inspect_cli.COMMANDS + ("attach",))}}} ... '
               '(each has --help).')
    parser.add_argument('--type',
                        help='launch type: ' + ', '.join(launcher.registered_launch_types())
                             + " (default: the script's --lp_launch_type if given, else local_mp)")
    parser.add_argument('script', help='the Python script that builds and launches the program')
    parser.add_argument('script_args', nargs=argparse.REMAINDER,
                        help='arguments passed to the script')
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in cli.COMMANDS:
        return cli.main(argv)
    if argv and argv[0] in inspect_cli.COMMANDS:
        return inspect_cli.main(argv)
    if argv and argv[0] == 'attach':
        return detached.main(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    script_argv = [args.script] + args.script_args
    try:
        flagged = launcher.launch_type_in(script_argv)
    except ValueError as e:
        parser.error(str(e))
    if args.type is not None and flagged is not None and flagged != args.type:
        parser.error(f'--type={args.type} and the script\'s --lp_launch_type={flagged} disagree; '
                     'give the launch type once.')
    launch_type = args.type or flagged or 'local_mp'
    known = launcher.registered_launch_types()
    if launch_type not in known:
        parser.error(f'unknown launch type {launch_type!r}; known launch types: '
                     f'{", ".join(known)}')
    launcher.run_as_script(launch_type)
    sys.argv = script_argv
    try:  # by its absolute path, as `python script.py` does: tracebacks name the file anywhere
        failed = _run_script(os.path.abspath(args.script))
    except SystemExit as e:
        if e.code in (None, 0):
            failed = None
        else:
            failed = e
    if failed is not None:  # the programs it launched end with it
        for controller in launcher.launched():
            controller.stop()
        if isinstance(failed, SystemExit):
            raise failed
        return failed
    status = 0
    for controller in launcher.launched():
        if controller.detached:
            continue  # it runs on after this command
        try:
            controller.wait()
        except NodeFailedError as e:
            print(f'\n{e}', file=sys.stderr, flush=True)
            status = 1
    return status


def _run_script(path: str) -> Optional[int]:
    """Runs the script at `path` as `__main__`. An exception that ends it is shown as `python
    script.py` shows it, without this command's frames, and its exit status is returned (None:
    the script ran to its end)."""
    try:
        runpy.run_path(path, run_name='__main__')
    except SystemExit:
        raise
    except BaseException as error:  # pylint: disable=broad-except
        trace = error.__traceback__
        while trace is not None and trace.tb_frame.f_code.co_filename != path:
            trace = trace.tb_next  # a syntax error has no frame of the script: none is left
        sys.excepthook(type(error), error.with_traceback(trace), trace)
        return 130 if isinstance(error, KeyboardInterrupt) else 1
    return None


if __name__ == '__main__':
    sys.exit(main())
