"""A pre-started interpreter that forks node processes in milliseconds.

Starting a Python process and importing launchpad, courier, grpc and numpy costs most of a second
per node, which dominates the launch of a program with many nodes. The fork server pays it once: it
imports those modules and then forks one child per node on request. Each child starts a new session,
takes its standard output from a file descriptor sent by the launcher, sets its environment and
working directory, and runs the worker entry point exactly as a fresh process would. The user's own
modules are imported only in the children, when the node's spec is unpickled.

The fork server serves one launch: it reports each child's exit code to the launcher and exits when
the launcher closes the connection or dies. It adopts what its nodes' processes leave behind (it
is a child subreaper, see `tree`): before it exits it gives the nodes still running the time to
notice that their launcher is gone and stop (their notice period), then ends every process left.
The ssh launcher's host agent forks its host's nodes the same way, with `preload` and
`fork_worker`.
"""
from __future__ import annotations

import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from launchpad.process import spec
from launchpad.process import tree
from launchpad.resources import THREAD_VARIABLES

_PRELOAD = ('launchpad', 'launchpad.process.coordinator', 'courier', 'courier.client',
            'courier.server', 'courier.transport', 'courier.transport.framed_client',
            'courier.transport.framed_server', 'courier.transport.grpc', 'grpc', 'cloudpickle',
            'numpy', 'absl.flags', 'absl.logging')
_MAX_MESSAGE = 1 << 20


def usable_for(env_overrides: Mapping[str, str], interpreter: Optional[str]) -> bool:
    """Whether a node with these resources can be forked rather than started fresh.

    A different interpreter, or variables read when an interpreter starts or when the libraries
    it preloads load (thread counts of numpy's BLAS), need a fresh process.
    """
    if interpreter not in (None, sys.executable):
        return False
    return not any(key.startswith(('PYTHON', 'LD_')) or key in THREAD_VARIABLES
                   for key in env_overrides)


class ForkServer:
    """The launcher's side: starts the fork server and asks it for processes.

    Attributes:
      on_exit: called (on the reader's thread) once a forked process's exit code is known, so
        that the launcher sees the exit at once instead of at its next poll.
    """

    on_exit: Optional[Callable[[], None]] = None

    def __init__(self, workdir: str, notice_period: float = 10.0):
        path = os.path.join(workdir, 'forkserver.sock')
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        self.process = subprocess.Popen(
            [sys.executable, '-m', __name__, path, str(notice_period)], stdin=subprocess.DEVNULL,
            start_new_session=True, env=spec.node_environment())
        listener.settimeout(0.1)
        try:
            self._conn = self._accept(listener)
        except BaseException:  # Ctrl-C included: it must not outlive the launch
            self.process.kill()
            self.process.wait()
            raise
        finally:
            listener.close()
            os.unlink(path)
        self._conn.settimeout(None)
        self._lock = threading.Lock()
        self._replies: Dict[str, int] = {}
        self._reply_ready = threading.Condition(self._lock)
        self._exit_codes: Dict[int, int] = {}
        self._reader = threading.Thread(target=self._read_replies, daemon=True,
                                        name='lp-forkserver')
        self._reader.start()

    def _accept(self, listener: socket.socket) -> socket.socket:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                return listener.accept()[0]
            except socket.timeout:
                if self.process.poll() is not None:
                    raise RuntimeError(f'The fork server exited with code {self.process.returncode} '
                                       'before it was ready; see its output above.') from None
        self.process.kill()
        self.process.wait()
        raise RuntimeError('The fork server was not ready within 60 s.')

    @property
    def pid(self) -> int:
        return self.process.pid

    def spawn(self, name: str, argv: List[str], env: Mapping[str, str], cwd: str,
              stdout_fd: int) -> 'ForkedProcess':
        """Forks a process that runs `argv` (Python arguments after the interpreter)."""
        request = json.dumps({'name': name, 'argv': argv, 'env': dict(env), 'cwd': cwd}).encode()
        with self._lock:
            socket.send_fds(self._conn, [len(request).to_bytes(4, 'big') + request], [stdout_fd])
            if not self._reply_ready.wait_for(lambda: name in self._replies or self._closed(), 60):
                raise RuntimeError(f'The fork server did not start {name} within 60 s.')
            if name not in self._replies:
                raise RuntimeError(f'The fork server died while starting {name}; see its output.')
            return ForkedProcess(self, self._replies.pop(name))

    def exit_code(self, pid: int) -> Optional[int]:
        with self._lock:
            return self._exit_codes.get(pid)

    def close(self, abort: bool = False) -> None:
        """Ends the fork server: after its children have ended, or, to `abort` a launch, ending
        them (and whatever it forked that the launcher did not hear of yet) at once."""
        if abort:
            request = json.dumps({'abort': True}).encode()
            try:
                self._conn.sendall(len(request).to_bytes(4, 'big') + request)
            except OSError:
                pass  # it is gone already
        try:
            self._conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _closed(self) -> bool:
        return not self._reader.is_alive()

    def _read_replies(self) -> None:
        stream = self._conn.makefile('rb')
        for line in stream:
            kind, key, value = line.decode().split()
            with self._lock:
                if kind == 'started':
                    self._replies[key] = int(value)
                else:
                    self._exit_codes[int(key)] = int(value)
                self._reply_ready.notify_all()
            on_exit = self.on_exit
            if kind == 'exited' and on_exit is not None:
                on_exit()
        with self._lock:
            self._reply_ready.notify_all()


class ForkedProcess:
    """A node process started by the fork server (`poll` like subprocess.Popen; it leads its own
    process group, which is how it is killed)."""

    def __init__(self, server: ForkServer, pid: int):
        self._server = server
        self.pid = pid

    def poll(self) -> Optional[int]:
        code = self._server.exit_code(self.pid)
        if code is None and self._server.process.poll() is not None:
            return -signal.SIGKILL  # the fork server is gone, and with it the report
        return code


def preload() -> None:
    """Imports the modules that every node needs, once, before forking nodes."""
    for module in _PRELOAD:
        try:
            __import__(module)
        except ImportError:
            pass


def fork_worker(request: dict, stdout_fd: int, close_fds: Sequence[int] = ()) -> int:
    """Forks a child of this (single-threaded) process that runs a node as a fresh process
    would, and returns its pid.

    `request` holds the Python arguments after the interpreter (`argv`, a `-m MODULE ARGS`
    command), the environment (`env`) and the working directory (`cwd`); the child writes to
    `stdout_fd`, reads nothing, and closes `close_fds` (descriptors of ours it must not hold).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_worker(request, stdout_fd, close_fds)
    return pid


def main() -> None:
    """The fork server's own process: `python -m launchpad.process.forkserver SOCKET NOTICE`."""
    tree.become_subreaper()
    preload()
    notice_period = float(sys.argv[2])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sys.argv[1])
    except OSError:
        return  # the launch was given up (e.g. Ctrl-C) before this process was ready
    children_ended, wakeup = socket.socketpair()
    wakeup.setblocking(False)
    signal.set_wakeup_fd(wakeup.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    launcher_pid = os.getppid()
    selector = selectors.DefaultSelector()
    selector.register(conn, selectors.EVENT_READ)
    selector.register(children_ended, selectors.EVENT_READ)
    workers: set = set()
    serving, aborted = True, False
    while serving:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is children_ended:
                children_ended.recv(4096)
            else:
                outcome = _serve_request(conn, workers)
                serving, aborted = outcome == 'served', outcome == 'abort'
        _report_exits(conn, workers)
        if os.getppid() != launcher_pid:
            break
    # Nodes whose launcher died stop by themselves once they notice (COORDINATOR_LOSS_TIMEOUT,
    # 5 s) and their notice period is over; then whatever is left goes. An aborted launch's
    # nodes go at once.
    deadline = time.monotonic() + (0.0 if aborted else notice_period + 8.0)
    while workers and time.monotonic() < deadline:
        time.sleep(0.1)
        _report_exits(None, workers)
    tree.end_descendants()
    # Nothing is left to do, and the launcher waits for this process: skip the interpreter's
    # finalization of what `preload` imported (grpc's among it), which takes a second or more
    # on a busy machine.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # pylint: disable=protected-access


def _serve_request(conn: socket.socket, workers: set) -> str:
    """Serves the launcher's next request: 'served', or 'closed' (the launcher closed the
    connection) or 'abort' (it aborts the launch)."""
    header, fds, _, _ = socket.recv_fds(conn, 4, 1)
    if not header:
        return 'closed'
    size = int.from_bytes(header, 'big')
    data = b''
    while len(data) < size:
        chunk = conn.recv(min(size - len(data), _MAX_MESSAGE))
        if not chunk:
            return 'closed'
        data += chunk
    request = json.loads(data)
    if request.get('abort'):
        return 'abort'
    pid = fork_worker(request, fds[0], [conn.fileno()])
    workers.add(pid)
    os.close(fds[0])
    conn.sendall(f'started {request["name"]} {pid}\n'.encode())
    return 'served'


def _report_exits(conn: Optional[socket.socket], workers: set) -> None:
    """Reaps ended children (adopted ones too) and tells the launcher about its nodes'."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in workers:
            continue  # an orphan adopted from a node
        workers.discard(pid)
        if conn is not None:
            try:
                conn.sendall(f'exited {pid} {os.waitstatus_to_exitcode(status)}\n'.encode())
            except OSError:
                pass  # the launcher is gone


def _become_worker(request: dict, stdout_fd: int, close_fds: Sequence[int]) -> None:
    code = 1
    try:
        for fd in close_fds:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(stdout_fd, 1)
        os.dup2(stdout_fd, 2)
        os.close(stdout_fd)
        os.environ.clear()
        os.environ.update(request['env'])
        os.chdir(request['cwd'])
        # Forked children must not share the fork server's random state. Only a loaded
        # numpy.random has one: importing it just to reseed it would cost every node (and
        # restart) 20-50 ms, and a node that imports it later seeds it afresh.
        numpy_random = sys.modules.get('numpy.random')
        if numpy_random is not None:
            numpy_random.seed()
        argv = request['argv']
        if argv[:1] != ['-m'] or len(argv) < 2:
            raise ValueError(f'The fork server runs `-m MODULE ARGS` commands, got {argv!r}.')
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # pylint: disable=broad-except
        import traceback  # pylint: disable=import-outside-toplevel
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # pylint: disable=protected-access


if __name__ == '__main__':
    main()
