"""launchpad's temporary directories name their owners; a sweep removes those whose owners
all ended (what killed processes left), and nothing else."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import launchpad as lp
from launchpad.launch import launcher as lp_launcher
from launchpad.process import tempdirs

# (launchpad.process alone: the interpreter starts faster without launchpad's package)
MAKE = ('import sys; sys.modules["launchpad"] = type(sys)("launchpad"); '
        'sys.modules["launchpad"].__path__ = [sys.argv[1]]; '
        'from launchpad.process import tempdirs; print(tempdirs.make("killed"), '
        'tempdirs.make("killed"))')


def test_a_sweep_removes_only_directories_whose_owners_all_ended():
    ended, shared = subprocess.run(  # their owner has exited
        [sys.executable, '-c', MAKE, os.path.dirname(lp.__file__)], capture_output=True,
        text=True, check=True).stdout.split()
    assert os.path.basename(ended).startswith('launchpad-killed-')
    tempdirs.claim(shared)  # an owner that ended, and this one
    tempdirs.claim(shared)  # (once only)
    with open(os.path.join(shared, tempdirs.OWNERS_FILE)) as f:
        assert len(f.read().splitlines()) == 2
    unowned = tempfile.mkdtemp(prefix='launchpad-old-')  # an older launchpad's: not judged
    elsewhere = tempfile.mkdtemp(prefix='launchpad-remote-')  # another machine's
    with open(os.path.join(elsewhere, tempdirs.OWNERS_FILE), 'w') as f:
        f.write('another-boot/pid:[1] 1 0.00 elsewhere\n')
    try:
        mine = tempdirs.make('alive')  # (making one sweeps too)
        assert not os.path.exists(ended)
        assert tempdirs.sweep() == []
        assert all(os.path.isdir(path) for path in (shared, unowned, elsewhere, mine))
    finally:
        for path in (shared, unowned, elsewhere, mine):
            shutil.rmtree(path)


def test_a_nodes_directories_go_inside_its_run_directory(monkeypatch):
    run_dir = tempfile.mkdtemp(prefix='launchpad-run-')
    try:
        monkeypatch.setenv(tempdirs.RUN_DIR_ENV, run_dir)
        inside = tempdirs.make('reverb')
        assert os.path.dirname(inside) == run_dir
        assert os.path.basename(inside).startswith('reverb-')
        outside = tempdirs.make('agent', inside_run=False)
        assert os.path.dirname(outside) == tempfile.gettempdir()
        shutil.rmtree(outside)
    finally:
        shutil.rmtree(run_dir)


def test_a_ctrl_c_while_a_launch_makes_or_packs_leaves_no_directory(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    program = lp.Program('interrupted')
    program.add_node(lp.PyNode(print, 'never'), label='printer')
    before = set(os.listdir(tempfile.gettempdir()))
    with monkeypatch.context() as patch:  # the program is being packed
        patch.setattr(lp_launcher, 'executables_of', interrupted)
        with pytest.raises(KeyboardInterrupt):
            lp.launch(program, launch_type='local_mp')
    with monkeypatch.context() as patch:  # the directory has just been made
        patch.setattr(tempdirs, '_add_owner', interrupted)
        with pytest.raises(KeyboardInterrupt):
            tempdirs.make()
    assert set(os.listdir(tempfile.gettempdir())) == before
