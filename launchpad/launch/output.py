"""Where node processes' output goes: the current terminal, per-node files, or a tmux session."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

TERMINALS = ('current_terminal', 'output_to_files', 'tmux_session')
_COLORS = [31, 32, 33, 34, 35, 36, 91, 92, 93, 94, 95, 96]


def check_terminal(terminal: Optional[str]) -> str:
    terminal = terminal or 'current_terminal'
    if terminal not in TERMINALS:
        raise ValueError(f'Unknown terminal {terminal!r}; choose one of {", ".join(TERMINALS)}.')
    return terminal


def prefix_for(name: str, index: int, *, color: bool) -> str:
    if not color:
        return f'[{name}] '
    return f'\x1b[{_COLORS[index % len(_COLORS)]}m[{name}]\x1b[0m '


class _PrefixedProcess:
    """A child whose output lines are copied to our stdout behind its colored name."""

    _write_lock = threading.Lock()

    def __init__(self, name: str, index: int, argv: List[str], env: Dict[str, str], cwd: str):
        self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._prefix = prefix_for(name, index, color=sys.stdout.isatty()).encode()
        self._reader = threading.Thread(target=self._copy, daemon=True, name=f'lp-out-{name}')
        self._reader.start()

    def _copy(self) -> None:
        out = getattr(sys.stdout, 'buffer', None)
        for line in iter(self.process.stdout.readline, b''):
            with self._write_lock:
                if out is not None:
                    out.write(self._prefix + line)
                    out.flush()
                else:
                    sys.stdout.write((self._prefix + line).decode(errors='replace'))
        self.process.stdout.close()

    def poll(self) -> Optional[int]:
        code = self.process.poll()
        if code is not None:
            self._reader.join(1.0)  # all of its output is printed before it counts as ended
        return code

    def kill(self) -> None:
        _kill_group(self.process.pid)


class _FileProcess:
    def __init__(self, argv: List[str], env: Dict[str, str], cwd: str, log_path: str):
        with open(log_path, 'ab') as log:
            self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def poll(self) -> Optional[int]:
        return self.process.poll()

    def kill(self) -> None:
        _kill_group(self.process.pid)


class _TmuxPane:
    """A node running in its own window of a tmux session."""

    def __init__(self, session: str, name: str):
        self._session = session
        self._window = name
        self._code: Optional[int] = None

    def _pane(self) -> Optional[List[str]]:
        listing = subprocess.run(
            ['tmux', 'list-panes', '-t', f'{self._session}:{self._window}', '-F',
             '#{pane_dead} #{pane_dead_status} #{pane_pid}'],
            capture_output=True, text=True, check=False)
        return listing.stdout.split() if listing.returncode == 0 else None

    def poll(self) -> Optional[int]:
        if self._code is None:
            pane = self._pane()
            if pane is None:
                self._code = -signal.SIGKILL
            elif pane[0] == '1':
                self._code = int(pane[1]) if pane[1].lstrip('-').isdigit() else 1
        return self._code

    def kill(self) -> None:
        pane = self._pane()
        if pane is not None and pane[0] == '0':
            _kill_group(int(pane[-1]))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Output:
    """Starts node processes with their output sent to the chosen terminal."""

    def __init__(self, terminal: Optional[str], program_name: str, workdir: str):
        self.terminal = check_terminal(terminal)
        self._workdir = workdir
        self._count = 0
        self._session = None
        self.log_dir = None
        if self.terminal == 'output_to_files':
            base = os.environ.get('LAUNCHPAD_LOGGING_DIR') or os.path.join(
                os.path.expanduser('~'), 'launchpad_logs')
            self.log_dir = os.path.join(base, f'{program_name}-{time.strftime("%Y%m%d-%H%M%S")}-'
                                              f'{os.getpid()}')
            os.makedirs(self.log_dir, exist_ok=True)
            print(f'Node logs of {program_name!r} are in {self.log_dir}', flush=True)
        elif self.terminal == 'tmux_session':
            self._session = f'lp-{program_name}-{os.getpid()}'.replace('.', '-').replace(':', '-')
            subprocess.run(['tmux', 'new-session', '-d', '-s', self._session, '-n', 'launchpad'],
                           check=True)
            subprocess.run(['tmux', 'set-option', '-t', self._session, 'remain-on-exit', 'on'],
                           check=True, capture_output=True)
            print(f'Nodes of {program_name!r} run in tmux: tmux attach -t {self._session}',
                  flush=True)

    def start(self, name: str, argv: List[str], env: Dict[str, str], cwd: str, *,
              title: Optional[str] = None):
        """Starts `argv` for node `name`; `title` (default `name`) prefixes its terminal lines."""
        index, self._count = self._count, self._count + 1
        if self.terminal == 'current_terminal':
            return _PrefixedProcess(title or name, index, argv, env, cwd)
        if self.terminal == 'output_to_files':
            return _FileProcess(argv, env, cwd, os.path.join(self.log_dir,
                                                             name.replace('/', '_') + '.log'))
        window = name.replace('/', '_')
        # The window's command line is visible in `ps`, so secrets travel in a private file.
        env_file = os.path.join(self._workdir, f'{index}.env')
        with open(os.open(env_file, os.O_WRONLY | os.O_CREAT, 0o600), 'w') as f:
            for key, value in env.items():
                f.write(f'export {key}={shlex.quote(value)}\n')
        command = f'. {shlex.quote(env_file)} && cd {shlex.quote(cwd)} && exec {shlex.join(argv)}'
        subprocess.run(['tmux', 'new-window', '-d', '-t', self._session, '-n', window,
                        'bash', '-c', command], check=True)
        return _TmuxPane(self._session, window)

    def close(self) -> None:
        if self._session is not None:
            subprocess.run(['tmux', 'kill-session', '-t', self._session], capture_output=True,
                           check=False)
