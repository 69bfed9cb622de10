"""Where node processes' output goes: the current terminal, per-node files, or a tmux session.

Output shown on the terminal is also kept (its last lines, per node) and output to files can be
read back, for `read_log` (`launchpad.process.logs`).
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

from launchpad.process import logs

TERMINALS = ('current_terminal', 'output_to_files', 'tmux_session')
_COLORS = [31, 32, 33, 34, 35, 36, 91, 92, 93, 94, 95, 96]
# Lines of a node's output that explain its death when it ends without reporting an error.
TAIL_LINES = 20
_write_lock = threading.Lock()


def check_terminal(terminal: Optional[str]) -> str:
    terminal = terminal or 'current_terminal'
    if terminal not in TERMINALS:
        raise ValueError(f'Unknown terminal {terminal!r}; choose one of {", ".join(TERMINALS)}.')
    return terminal


def prefix_for(name: str, index: int, *, color: bool) -> str:
    if not color:
        return f'[{name}] '
    return f'\x1b[{_COLORS[index % len(_COLORS)]}m[{name}]\x1b[0m '


def copy_lines(source, prefix: bytes, tail: Optional[logs.LogTail] = None) -> None:
    """Copies lines from the binary stream `source` to our stdout, each behind `prefix` (and
    keeps them in `tail`)."""
    out = getattr(sys.stdout, 'buffer', None)
    for line in iter(source.readline, b''):
        if not line.endswith(b'\n'):
            line += b'\n'
        if tail is not None:
            tail.add(line[:-1].decode(errors='replace'))
        with _write_lock:
            if out is not None:
                out.write(prefix + line)
                out.flush()
            else:
                sys.stdout.write((prefix + line).decode(errors='replace'))
    source.close()


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def log_file_name(node: str) -> str:
    """The name of node `node`'s log file (output to files)."""
    return node.replace('/', '_') + '.log'


class TmuxPane:
    """A node running in its own window of a tmux session (`poll` and `kill` like Popen).

    The window's command writes its exit code to `code_file` when it ends.
    """

    def __init__(self, target: str, code_file: str):
        self._target = target
        self._code_file = code_file

    def poll(self) -> Optional[int]:
        try:
            with open(self._code_file) as f:
                return int(f.read().strip() or 1)
        except FileNotFoundError:
            pass
        if self._pane_pid() is None:  # the window is gone without a word: it was killed
            return -signal.SIGKILL
        return None

    def kill(self) -> None:
        pid = self._pane_pid()
        if pid is not None:
            kill_group(pid)

    def _pane_pid(self) -> Optional[int]:
        listing = subprocess.run(['tmux', 'list-panes', '-t', self._target, '-F', '#{pane_pid}'],
                                 capture_output=True, text=True, check=False)
        return int(listing.stdout.split()[0]) if listing.returncode == 0 and listing.stdout else None


class Output:
    """Gives each node process somewhere to write, as the chosen terminal says."""

    def __init__(self, terminal: Optional[str], program_name: str, workdir: str, *,
                 log_dir: Optional[str] = None):
        """`log_dir`: where 'output_to_files' writes: the launchers pass the program's run
        directory's (`launchpad.observe.runstore.logs_directory`), a detached program's keeps it
        across supervisors (default: a new directory under `$LAUNCHPAD_LOGGING_DIR` or
        `~/launchpad_logs`)."""
        self.terminal = check_terminal(terminal)
        self._workdir = workdir
        self._count = 0
        self._session: Optional[str] = None
        self.log_dir: Optional[str] = None
        self._tails: Dict[str, logs.LogTail] = {}
        if self.terminal == 'output_to_files' and log_dir is not None:
            self.log_dir = log_dir
            os.makedirs(self.log_dir, exist_ok=True)
            print(f'Node logs of {program_name!r} are in {self.log_dir}', flush=True)
        elif self.terminal == 'output_to_files':
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
            print(f'Nodes of {program_name!r} run in tmux: tmux attach -t {self._session}',
                  flush=True)

    @property
    def runs_commands(self) -> bool:
        """True if nodes must be started through `start_command` (tmux) rather than given a fd."""
        return self._session is not None

    def open_for(self, name: str, *,
                 title: Optional[str] = None) -> Tuple[int, Optional[threading.Thread]]:
        """A file descriptor for the node's stdout and stderr (the caller closes it once the
        process has it), and the thread copying its output, if any. `title` (default `name`)
        prefixes its lines on the terminal."""
        index, self._count = self._count, self._count + 1
        if self.terminal == 'output_to_files':
            return os.open(self._file_of(name), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                           0o644), None
        read_fd, write_fd = os.pipe()
        prefix = prefix_for(title or name, index, color=sys.stdout.isatty()).encode()
        tail = self._tails[name] = logs.LogTail()
        reader = threading.Thread(target=copy_lines, args=(os.fdopen(read_fd, 'rb'), prefix, tail),
                                  daemon=True, name=f'lp-out-{name}')
        reader.start()
        return write_fd, reader

    def read_log(self, name: str, cursor: Optional[int] = None) -> Tuple[List[str], int]:
        """Lines node `name` printed after `cursor` (None: its last lines) and the next cursor.

        Raises:
          LookupError: this output keeps no log of `name` (tmux windows keep their own).
        """
        if name in self._tails:
            return self._tails[name].read(cursor)
        if self.log_dir is not None:
            return logs.read_file(self._file_of(name), cursor)
        where = (f'in tmux session {self._session}' if self._session is not None
                 else 'on the launching terminal')
        raise LookupError(f'no log is kept of {name!r}: its output goes {where}.')

    def tail(self, name: str) -> str:
        """The last `TAIL_LINES` lines node `name` wrote (its standard error included), as far
        as they are known here ('' in a tmux session)."""
        try:
            lines, _ = self.read_log(name)
        except (LookupError, OSError):
            return ''
        return ''.join(line + '\n' for line in lines[-TAIL_LINES:])

    def _file_of(self, name: str) -> str:
        return os.path.join(self.log_dir, log_file_name(name))

    def start_command(self, name: str, argv: List[str], env: Dict[str, str], cwd: str) -> TmuxPane:
        """Runs `argv` in a new tmux window named after the node."""
        index, self._count = self._count, self._count + 1
        window = name.replace('/', '_')
        # A window's command line is visible in `ps`, so the environment goes in a private file.
        env_file = os.path.join(self._workdir, f'{index}.env')
        code_file = os.path.join(self._workdir, f'{index}.exit')
        with open(os.open(env_file, os.O_WRONLY | os.O_CREAT, 0o600), 'w') as f:
            for key, value in env.items():
                f.write(f'export {key}={shlex.quote(value)}\n')
        command = (f'. {shlex.quote(env_file)} && cd {shlex.quote(cwd)} && {shlex.join(argv)}; '
                   f'echo $? > {shlex.quote(code_file)}')
        subprocess.run(['tmux', 'new-window', '-d', '-t', self._session, '-n', window,
                        'bash', '-c', command], check=True)
        return TmuxPane(f'{self._session}:{window}', code_file)

    def close(self) -> None:
        if self._session is not None:
            subprocess.run(['tmux', 'kill-session', '-t', self._session], capture_output=True,
                           check=False)
