"""The observer verbs run on a detached program from its launching machine, checked in one go by
the tests of the launchers whose supervisor runs elsewhere (`follow_then_detach`,
`check_verbs`)."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Callable

from launchpad.observe import cli, inspect_cli
from tests.testbeds import REPO_ROOT


def follow_then_detach(run: str, line: str, timeout: float = 60.0) -> str:
    """Runs `python -m launchpad.launch attach RUN` until it prints `line` (prefixed by its
    node), then presses Ctrl-C; checks that it detached (exit status 0, saying so) and returns
    what it printed."""
    process = subprocess.Popen([sys.executable, '-m', 'launchpad.launch', 'attach', run],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, 'PYTHONUNBUFFERED': '1'})
    out = b''
    deadline = time.monotonic() + timeout
    try:
        while line.encode() not in out and time.monotonic() < deadline:
            if process.poll() is not None:
                break
            if select.select([process.stdout], [], [], 0.5)[0]:
                out += os.read(process.stdout.fileno(), 65536)
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    out += rest
    text = out.decode(errors='replace')
    errors = err.decode(errors='replace')
    assert line in text, text + errors
    assert process.returncode == 0, text + errors
    assert 'Detached from' in errors and 'it keeps running' in errors, errors
    return text


def check_verbs(run: str, finished: str, line: str, running: str, frame: str,
                written: Callable[[], str], capsys) -> None:
    """`logs RUN NODE` and `logs RUN` show node `finished`'s `line`, and `logs RUN NODE` only
    lines it wrote (`written()`: its log as the platform keeps it, read after `logs`, since the
    node may go on writing); `stacks RUN NODE` shows node
    `running`'s threads, live, `frame` (a file or function) among them; `waits RUN` has an
    answer from every running node."""
    capsys.readouterr()
    assert inspect_cli.main(['stacks', run, running]) == 0, capsys.readouterr().err
    stacks = capsys.readouterr().out
    assert stacks.startswith(f'== {running}: live (pid '), stacks
    assert 'Thread MainThread' in stacks and frame in stacks, stacks
    assert inspect_cli.main(['waits', run, '--json']) == 0, capsys.readouterr().err
    waits = json.loads(capsys.readouterr().out)
    assert waits['silent'] == [] and waits['deadlocks'] == [], waits
    assert cli.main(['logs', run, finished]) == 0, capsys.readouterr().err
    shown = capsys.readouterr().out.splitlines()
    assert any(one.startswith(line) for one in shown), shown
    kept = written()
    assert set(shown) <= set(kept.splitlines()), (shown, kept)  # whole lines, in full
    assert cli.main(['logs', run]) == 0, capsys.readouterr().err
    assert any(one.startswith(f'[{finished}] {line}')
               for one in capsys.readouterr().out.splitlines())
