"""Test beds for the multi-host launchers: SSH hosts, Slurm clusters and podman pods, for real.

Each bed is a context manager that brings the bed up with its shell script (next to this file),
yields a description of it, and always takes it down again, then checks that nothing is left
behind. A bed whose prerequisites are missing (root, network namespaces, the Debian packages
of install_packages.sh) calls `require_testbed`: the test is skipped with the reason, or fails
when the environment sets LAUNCHPAD_TESTBEDS=required (as CI does).

Beds are machine-wide (fixed names and addresses), so a bed is held by one process at a time:
another process waits for it (up to LAUNCHPAD_TESTBED_WAIT seconds, default 60), then fails
naming the holder. The SSH bed
and the multi-node Slurm bed share one network and may be up together, in any order.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Iterator, NoReturn, Sequence

HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
INSTALL_HINT = 'install them with tests/testbeds/install_packages.sh (as root)'
SUBNET = '10.200.0'
NET_REGISTRY = pathlib.Path('/run/lp-testbed/net')
LOCK_DIR = pathlib.Path('/run/lock')
TAG = '# lp-testbed'


class TestbedError(RuntimeError):
    """A bed that has its prerequisites could not be brought up or left something behind."""

    __test__ = False  # not a test class, despite the name


def require_testbed(reason: str) -> NoReturn:
    """Skips the calling test because a test bed is unavailable, or fails it if beds are required."""
    import pytest  # only tests call this; the rest of the module needs nothing but the stdlib

    if os.environ.get('LAUNCHPAD_TESTBEDS') == 'required':
        pytest.fail(f'test bed required (LAUNCHPAD_TESTBEDS=required) but unavailable: {reason}',
                    pytrace=False)
    pytest.skip(reason)


@dataclasses.dataclass(frozen=True)
class SshHost:
    """One host of the SSH bed. The filesystem is shared, so `python` is valid there too."""

    name: str
    ip: str
    user: str
    identity_file: str
    ssh_config: str
    python: str = sys.executable

    @property
    def ssh_options(self) -> list[str]:
        """Client options that log in without ~/.ssh/config (it also has them while the bed is up)."""
        return ['-i', self.identity_file, '-o', 'IdentitiesOnly=yes',
                '-o', 'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null',
                '-o', 'LogLevel=ERROR', '-o', 'BatchMode=yes', '-o', 'ConnectTimeout=5']

    def ssh_command(self, command: str) -> list[str]:
        """argv running the shell `command` on this host (ssh joins arguments into one string)."""
        return ['ssh', *self.ssh_options, f'{self.user}@{self.ip}', command]


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    """A running Slurm cluster; `srun`, `sbatch` and friends on PATH talk to it."""

    mode: str                  # 'single' or 'multi'
    nodes: tuple[str, ...]     # node names, as in `srun -w`
    addresses: tuple[str, ...]  # the nodes' IPs, in the same order
    controller: str            # slurmctld's address


@dataclasses.dataclass(frozen=True)
class PodmanNetwork:
    """The podman bed: an offline image and an internal network with no NAT and no DNS.

    Run pods with `podman kube play --network NETWORK`, addresses via `--ip` or hostAliases.
    The image has Python and launchpad's dependencies, not launchpad: mount `source_dir` with a
    hostPath volume and put it on PYTHONPATH.
    """

    image: str
    network: str
    subnet: str
    python: str
    source_dir: str


# --- prerequisites -------------------------------------------------------------------------

def _missing_commands(commands: Sequence[str]) -> list[str]:
    return [c for c in commands if shutil.which(c) is None]


def _check_prerequisites(bed: str, commands: Sequence[str], namespaces: bool) -> None:
    if sys.platform != 'linux':
        require_testbed(f'the {bed} test bed needs Linux')
    if os.geteuid() != 0:
        require_testbed(f'the {bed} test bed needs root (running as uid {os.geteuid()})')
    missing = _missing_commands(commands)
    if missing:
        require_testbed(f'the {bed} test bed needs {", ".join(missing)}; {INSTALL_HINT}')
    if namespaces:
        probe = subprocess.run(['unshare', '--net', '--uts', 'true'], capture_output=True, text=True)
        if probe.returncode != 0 or shutil.which('ip') is None:
            require_testbed(f'the {bed} test bed needs network and UTS namespaces and `ip netns`: '
                            f'{probe.stderr.strip() or "ip (iproute2) not found"}')


# --- machine state, for the leftover checks -------------------------------------------------

def _stat(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name ([0] state, [19] start time); [] if gone."""
    try:
        return pathlib.Path(f'/proc/{pid}/stat').read_text().rpartition(')')[2].split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """True while `pid` runs; a zombie awaiting its reaper has ended."""
    return _stat(pid)[:1] not in ([], ['Z'])


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks: with the pid, it names one process for good."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else None


def _processes() -> Iterator[tuple[int, str]]:
    """(pid, command line) of every live process."""
    for entry in pathlib.Path('/proc').iterdir():
        if not entry.name.isdigit() or not _alive(int(entry.name)):
            continue
        try:
            cmdline = (entry / 'cmdline').read_bytes().replace(b'\0', b' ').decode(errors='replace')
        except OSError:
            continue
        if cmdline.strip():
            yield int(entry.name), cmdline.strip()


def _net_users() -> list[str]:
    return sorted(p.name for p in NET_REGISTRY.iterdir()) if NET_REGISTRY.is_dir() else []


def _namespaces() -> list[str]:
    out = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith('lp-h')]


def _net_leftovers() -> list[str]:
    """What remains of the shared network although no bed uses it any more."""
    if _net_users():
        return []
    found = [f'network namespace {ns}' for ns in _namespaces()]
    if pathlib.Path('/sys/class/net/lpbr0').exists():
        found.append('bridge lpbr0')
    found += [f'/etc/hosts line {line!r}' for line in pathlib.Path('/etc/hosts').read_text().splitlines()
              if line.endswith(TAG)]
    return found


def _state_dir(bed: str) -> pathlib.Path:
    return pathlib.Path(tempfile.gettempdir()) / f'lp-testbed-{bed}'


def _tagged(path: str) -> bool:
    try:
        with open(path) as f:
            return TAG in f.readline()
    except OSError:
        return False


def _ssh_leftovers() -> list[str]:
    state = str(_state_dir('ssh'))
    found = [f'process {pid}: {cmd}' for pid, cmd in _processes() if state in cmd]
    if _state_dir('ssh').exists():
        found.append(f'state directory {state}')
    ssh_config = pathlib.Path.home() / '.ssh' / 'config'
    if ssh_config.exists() and '# lp-testbed ssh begin' in ssh_config.read_text():
        found.append(f'block in {ssh_config}')
    return found + _net_leftovers()


def _slurm_leftovers() -> list[str]:
    daemons = ('slurmctld', 'slurmd', 'slurmstepd')
    state = str(_state_dir('slurm'))
    found = [f'process {pid}: {cmd}' for pid, cmd in _processes()
             if state in cmd or os.path.basename(cmd.split()[0]) in daemons]
    if _state_dir('slurm').exists():
        found.append(f'state directory {state}')
    if _tagged('/etc/slurm/slurm.conf'):
        found.append('our /etc/slurm/slurm.conf')
    return found + _net_leftovers()


def _podman_leftovers() -> list[str]:
    def podman(*args: str) -> list[str]:
        out = subprocess.run(['podman', *args], capture_output=True, text=True).stdout
        return out.split()

    found = [f'container {c}' for c in podman('ps', '-aq', '--filter', 'network=lpnet')]
    found += [f'pod {p}' for p in podman('pod', 'ps', '-q', '--filter', 'network=lpnet')]
    if 'lpnet' in podman('network', 'ls', '--format', '{{.Name}}'):
        found.append('podman network lpnet')
    found += [f'process {pid}: {cmd}' for pid, cmd in _processes()
              if os.path.basename(cmd.split()[0]) == 'conmon']
    if _tagged('/etc/containers/containers.conf'):
        found.append('our /etc/containers/containers.conf')
    return found


LEFTOVER_CHECKS = {'ssh': _ssh_leftovers, 'slurm': _slurm_leftovers, 'podman': _podman_leftovers}


def leftovers(bed: str) -> list[str]:
    """Describes what bed ('ssh', 'slurm' or 'podman') has left on this machine; [] when clean."""
    return LEFTOVER_CHECKS[bed]()


# --- running the scripts ---------------------------------------------------------------------

_lock_files: dict[str, tuple[object, int]] = {}  # bed -> (open lock file, holders in this process)
_up: set[str] = set()


@contextlib.contextmanager
def holding(bed: str) -> Iterator[None]:
    """Keeps other processes away from `bed` ('ssh', 'slurm' or 'podman') while inside, so that
    a test can check the machine after a bed went down before anyone else brings it up again."""
    if bed in _lock_files:
        lock, holders = _lock_files[bed]
        _lock_files[bed] = (lock, holders + 1)
    else:
        _lock_files[bed] = (_acquire(bed), 1)
    try:
        yield
    finally:
        lock, holders = _lock_files.pop(bed)
        if holders > 1:
            _lock_files[bed] = (lock, holders - 1)
        else:
            lock.close()  # releases the flock


def _acquire(bed: str):
    wait = float(os.environ.get('LAUNCHPAD_TESTBED_WAIT', '60'))
    lock = open(LOCK_DIR / f'lp-testbed-{bed}.lock', 'a+')
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.seek(0)
                holder = _describe(lock.read())
                lock.close()
                raise TestbedError(f'the {bed} test bed is still held by {holder} '
                                   f'after {wait:.0f} s (LAUNCHPAD_TESTBED_WAIT)') from None
            time.sleep(0.2)
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def _describe(pid: str) -> str:
    try:
        raw = pathlib.Path(f'/proc/{int(pid)}/cmdline').read_bytes()
    except (OSError, ValueError):
        return f'process {pid.strip() or "?"}'
    cmdline = raw.replace(b'\0', b' ').decode(errors='replace').strip()
    return f'process {int(pid)} ({cmdline})'


@contextlib.contextmanager
def _exclusive(bed: str) -> Iterator[None]:
    """Holds the bed for this process; other processes wait, a second bed here is a bug."""
    if bed in _up:
        raise TestbedError(f'the {bed} test bed is already up in this process; '
                           f'use the session fixture instead of bringing it up again')
    with holding(bed):
        _up.add(bed)
        try:
            yield
        finally:
            _up.discard(bed)


def _uts_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f'/proc/{pid}/ns/uts')
    except OSError:
        return None


class _Script:
    """Runs one bed's shell script and checks that its `down` leaves nothing behind.

    The bed's daemons each run in a UTS namespace of their own, which everything they start
    inherits (ssh sessions, job steps, daemonised or not): `down` checks that none of the
    processes in them survives. (It cannot just look for the namespaces afterwards: the kernel
    reuses a freed namespace's number at once, e.g. for a container another process starts.)
    """

    def __init__(self, bed: str, script: str, daemon_pidfiles: str = ''):
        self.bed = bed
        self.path = HERE / script
        self.daemon_pidfiles = daemon_pidfiles
        self.uts_namespaces: set[str] = set()

    def run(self, *args: str, timeout: float = 300) -> str:
        env = dict(os.environ, LP_TESTBED_TMPDIR=tempfile.gettempdir(), LP_PYTHON=sys.executable,
                   LP_TESTBED_LOCKED=self.bed)  # the caller holds it, see _exclusive
        try:
            done = subprocess.run(['bash', str(self.path), *args], env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise TestbedError(f'{self.path.name} {" ".join(args)} took over {timeout:.0f} s') from e
        if done.returncode != 0:
            raise TestbedError(f'{self.path.name} {" ".join(args)} failed (exit {done.returncode}):\n'
                               f'{done.stderr.strip()}')
        return done.stdout

    def up(self, *args: str) -> str:
        out = self.run(*args)
        if self.daemon_pidfiles:
            for pidfile in _state_dir(self.bed).glob(self.daemon_pidfiles):
                namespace = _uts_namespace(int(pidfile.read_text()))
                if namespace:
                    self.uts_namespaces.add(namespace)
        return out

    def down(self) -> None:
        started = {pid: (_start_time(pid), cmd) for pid, cmd in _processes()
                   if _uts_namespace(pid) in self.uts_namespaces}
        self.run('down', timeout=120)
        left = leftovers(self.bed) + [
            f'process {pid}: {cmd}' for pid, (start, cmd) in started.items()
            if start is not None and _start_time(pid) == start and _alive(pid)]
        self.uts_namespaces.clear()
        if left:
            raise TestbedError(f'{self.path.name} down left behind: ' + '; '.join(left))


@contextlib.contextmanager
def _running(script: _Script) -> Iterator[_Script]:
    with _exclusive(script.bed):
        try:
            yield script
        finally:
            script.down()


# --- the beds --------------------------------------------------------------------------------

SSH_COMMANDS = ('ip', 'flock', 'nsenter', 'unshare', 'ssh', 'ssh-keygen', '/usr/sbin/sshd')
SLURM_COMMANDS = ('ip', 'flock', 'nsenter', 'unshare', 'munge', '/usr/sbin/munged',
                  '/usr/sbin/slurmctld', '/usr/sbin/slurmd', 'srun', 'sbatch', 'sinfo', 'squeue',
                  'scancel')
PODMAN_COMMANDS = ('podman', 'runc', 'iptables', 'ldd', '/usr/bin/python3.11')


@contextlib.contextmanager
def ssh_hosts(n: int = 3) -> Iterator[list[SshHost]]:
    """Hosts lp-h1..n (10.200.0.2..), each with its own network, hostname and sshd for root."""
    _check_prerequisites('SSH', SSH_COMMANDS, namespaces=True)
    with _running(_Script('ssh', 'ssh_hosts.sh', 'sshd-*.pid')) as script:
        script.up('up', str(n))
        state = _state_dir('ssh')
        yield [SshHost(name=f'lp-h{i}', ip=f'{SUBNET}.{i + 1}', user='root',
                       identity_file=str(state / 'id_ed25519'), ssh_config=str(state / 'ssh_config'))
               for i in range(1, n + 1)]


class SlurmTestbed:
    """The Slurm bed for a whole test session: one cluster at a time, switched between modes on
    demand, so that single-node and multi-node tests can share a session."""

    def __init__(self, script: _Script):
        self._script = script
        self.cluster: SlurmCluster | None = None

    def cluster_for(self, mode: str = 'single', n: int = 3) -> SlurmCluster:
        """The running cluster in `mode` ('single' or 'multi' with `n` nodes), brought up if needed."""
        if mode not in ('single', 'multi'):
            raise ValueError(f"Slurm test bed mode must be 'single' or 'multi', not {mode!r}")
        if mode == 'multi':
            _check_prerequisites('multi-node Slurm', (), namespaces=True)
        wanted = (mode, 1 if mode == 'single' else n)
        if self.cluster is None or (self.cluster.mode, len(self.cluster.nodes)) != wanted:
            self.cluster = None
            if mode == 'single':
                nodes = tuple(self._script.up('single').split()[::2])
                self.cluster = SlurmCluster('single', nodes, ('127.0.0.1',), '127.0.0.1')
            else:
                self._script.up('multi', str(n))
                self.cluster = SlurmCluster(
                    'multi', tuple(f'lp-h{i}' for i in range(1, n + 1)),
                    tuple(f'{SUBNET}.{i + 1}' for i in range(1, n + 1)), f'{SUBNET}.1')
        return self.cluster


@contextlib.contextmanager
def slurm_testbed() -> Iterator[SlurmTestbed]:
    """Holds the Slurm bed; use `cluster_for(mode)` to get a cluster. Taken down on exit."""
    _check_prerequisites('Slurm', SLURM_COMMANDS, namespaces=False)
    with _running(_Script('slurm', 'slurm_cluster.sh', 'slurmd-*.pid')) as script:
        yield SlurmTestbed(script)


@contextlib.contextmanager
def slurm_cluster(mode: str = 'single', n: int = 3) -> Iterator[SlurmCluster]:
    """A Slurm cluster: 'single' (one node on 127.0.0.1) or 'multi' (nodes lp-h1..n)."""
    with slurm_testbed() as bed:
        yield bed.cluster_for(mode, n)


@contextlib.contextmanager
def podman_network() -> Iterator[PodmanNetwork]:
    """Podman set up for `kube play` on the internal network lpnet (10.201.0.0/24).

    The first run builds the image (a few seconds); later runs reuse it until launchpad's
    dependencies or the build recipe change. Pods left on lpnet are removed on exit.
    """
    _check_prerequisites('podman', PODMAN_COMMANDS, namespaces=False)
    with _running(_Script('podman', 'podman_image.sh')) as script:
        script.up('up')
        yield PodmanNetwork(image='localhost/lp-python:latest', network='lpnet',
                            subnet='10.201.0.0/24', python='/usr/bin/python3',
                            source_dir=str(REPO_ROOT))


SHMEM_ENABLED = pathlib.Path('/sys/kernel/mm/transparent_hugepage/shmem_enabled')


@contextlib.contextmanager
def shmem_huge_pages() -> Iterator[None]:
    """The kernel gives shared memory advised for it huge pages (`shmem_enabled` set to
    `advise`) while inside, then its setting as before. Needs root; a machine-wide setting, so
    held by one process at a time like the other beds (`never`, the usual default, and
    `advise` differ only for memory advised with MADV_HUGEPAGE)."""
    try:
        text = SHMEM_ENABLED.read_text()
        before = text[text.index('[') + 1:text.index(']')]
    except (OSError, ValueError):
        require_testbed(f'no transparent huge pages for shared memory here ({SHMEM_ENABLED})')
    if os.geteuid() != 0 or not os.access(SHMEM_ENABLED, os.W_OK):
        require_testbed(f'changing {SHMEM_ENABLED} needs root')
    with _exclusive('shmem-huge-pages'):
        SHMEM_ENABLED.write_text('advise')
        try:
            yield
        finally:
            SHMEM_ENABLED.write_text(before)
