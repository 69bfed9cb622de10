"""The registry of running programs: private to its user, and rid of programs that are gone."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from launchpad.observe import registry


def _entry(name: str, **fields) -> registry.Entry:
    return registry.Entry(id=registry.new_id(name), name=name, launch_type='local_mp',
                          address='unix:/nowhere', token='t', **fields)


def _listening(entry: registry.Entry) -> None:
    """Registers `entry` and makes its socket, as an observer does when it binds."""
    registry.register(entry)
    open(registry.socket_path(entry.id), 'w').close()


SHORT_PROGRAM = '''
import sys
import tempfile
import launchpad as lp
program = lp.Program('short')
program.add_node(lp.PyNode(print, 'done at once'), label='node')
lp.launch(program, launch_type=sys.argv[1])
'''


@pytest.mark.parametrize('launch_type', ['local_mt', 'local_mp'])
def test_a_program_that_ends_at_once_leaves_nothing_in_the_registry(runtime_dir, launch_type):
    for _ in range(3):  # it ended before or while its observer registered it: racy before
        done = subprocess.run([sys.executable, '-c', SHORT_PROGRAM, launch_type],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert 'done at once' in done.stdout
        assert os.listdir(runtime_dir) == []


def test_entries_are_private_files_in_a_private_directory(runtime_dir):
    entry = _entry('my program/1')
    registry.register(entry)
    assert registry.entries() == []  # not listed until its observer listens
    open(registry.socket_path(entry.id), 'w').close()
    assert entry.id.startswith('my-program-1-')
    assert os.stat(runtime_dir).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(runtime_dir, f'{entry.id}.json')).st_mode & 0o777 == 0o600
    assert registry.entries() == [entry]
    registry.unregister(entry.id)
    assert registry.entries() == []


def test_a_program_whose_launcher_is_gone_is_pruned(runtime_dir):
    done = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'],
                          capture_output=True, text=True, check=True)
    _listening(_entry('dead', pid=int(done.stdout)))
    alive = _entry('alive')
    _listening(alive)
    assert registry.entries() == [alive]
    assert sorted(os.listdir(runtime_dir)) == [f'{alive.id}.json', f'{alive.id}.sock']
    registry.unregister(alive.id)


def test_an_old_socket_without_an_entry_is_removed(runtime_dir):
    old, new = (os.path.join(runtime_dir, f'{name}.sock') for name in ('old-1', 'new-2'))
    for path in (old, new):
        open(path, 'w').close()
    os.utime(old, (0, 0))
    registry.entries()
    assert os.listdir(runtime_dir) == ['new-2.sock']  # it may be a registration under way
    os.unlink(new)


def test_find_by_id_its_start_or_name_and_say_what_runs_otherwise(runtime_dir):
    del runtime_dir
    first, second = _entry('twin'), _entry('twin')
    for entry in (first, second):
        _listening(entry)
    assert registry.find(first.id) == first
    assert registry.find(second.id[:-1]) == second
    with pytest.raises(registry.RegistryError, match='2 running programs match .twin.'):
        registry.find('twin')
    with pytest.raises(registry.RegistryError, match=r'running programs of yours .* twin \('):
        registry.find('nothing')
    for entry in (first, second):
        registry.unregister(entry.id)


def test_a_directory_open_to_others_is_refused(runtime_dir):
    os.chmod(runtime_dir, 0o755)
    try:
        with pytest.raises(registry.RegistryError, match='open to other users.*chmod 700'):
            registry.entries()
    finally:
        os.chmod(runtime_dir, 0o700)


@pytest.mark.skipif(os.geteuid() != 0, reason='giving a directory to another user needs root')
def test_a_directory_of_another_user_is_refused(runtime_dir):
    os.chown(runtime_dir, 65534, 65534)
    try:
        with pytest.raises(registry.RegistryError, match='belongs to another user'):
            registry.register(_entry('mine'))
    finally:
        os.chown(runtime_dir, 0, 0)


def test_without_a_setting_it_is_the_same_directory_in_every_shell(monkeypatch, tmp_path):
    monkeypatch.delenv(registry.ENV, raising=False)
    monkeypatch.setenv('XDG_RUNTIME_DIR', str(tmp_path))
    monkeypatch.setenv('TMPDIR', '/somewhere/else')
    assert registry.directory() == tmp_path / 'launchpad'
    monkeypatch.delenv('XDG_RUNTIME_DIR')
    assert str(registry.directory(create=False)) == f'/tmp/lp-runtime-{os.getuid()}'


def test_a_detached_program_between_supervisors_is_kept_while_its_keeper_lives(runtime_dir):
    # Its supervisor died and its keeper starts a new one: the entry is not listed (nothing
    # answers at its socket), but it stays for `attach --recover` and the tunnels' check to read
    # the keeper from; once the keeper is gone too, it is pruned.
    keeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    try:
        dead = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'],
                              capture_output=True, text=True, check=True)
        entry = _entry('between', pid=int(dead.stdout), keeper_pid=keeper.pid,
                       pid_started=registry.process_started(keeper.pid) + 0.5)
        _listening(entry)
        assert registry.entries() == []
        assert sorted(os.listdir(runtime_dir)) == [f'{entry.id}.json', f'{entry.id}.sock']
        assert registry.keeper_alive(entry)
    finally:
        keeper.kill()
        keeper.wait()
    assert not registry.keeper_alive(entry)
    assert registry.entries() == []
    assert os.listdir(runtime_dir) == []
    # A program supervised on another host: its keeper's pid means nothing here.
    remote = _entry('remote', keeper_pid=os.getpid(), ssh=['ssh', 'lp-h2'])
    with pytest.raises(ValueError, match='supervised on .* means nothing on this machine'):
        registry.keeper_alive(remote)


def test_a_runtime_directory_too_long_for_a_socket_is_refused_with_the_fix(runtime_dir,
                                                                           monkeypatch):
    del runtime_dir
    long = tempfile.mkdtemp(prefix='lp-' + 'x' * 90)
    monkeypatch.setenv(registry.ENV, long)
    try:
        with pytest.raises(registry.RegistryError,
                           match=rf'socket path .* 107 .*{registry.ENV}=.*shorter'):
            registry.socket_path(registry.new_id('long'))
    finally:
        shutil.rmtree(long)
