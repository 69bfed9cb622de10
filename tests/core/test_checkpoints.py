"""`lp.get_context().checkpoint_dir`, `lp.save_checkpoint` and `lp.load_checkpoint`."""
import os

import pytest

import launchpad as lp
from launchpad import runtime
from tests import checkpoint_programs as programs


@pytest.mark.parametrize('launch_type', ['test_mt', 'test_mp'])
def test_a_stop_handlers_checkpoint_is_restored_by_the_restarted_attempt(launch_type, tmp_path):
    how = 'crash' if launch_type == 'test_mt' else 'sigterm'  # threads cannot be preempted
    controller = lp.launch(programs.saver_program(str(tmp_path), how), launch_type=launch_type)
    assert controller.wait(timeout=60)
    found = programs.restored(str(tmp_path))
    assert sorted(found) == [('saver', i, a) for i in (0, 1) for a in (0, 1)]
    for index in (0, 1):
        assert found['saver', index, 0]['restored'] == {'steps': 0, 'saved_by': []}
        assert found['saver', index, 1]['restored'] == {'steps': 1, 'saved_by': [0]}
        assert found['saver', index, 1]['checkpoint_dir'] == found['saver', index, 0][
            'checkpoint_dir']
    directories = {found['saver', i, 0]['checkpoint_dir'] for i in (0, 1)}
    assert len(directories) == 2  # each node has its own
    assert not any(os.path.exists(d) for d in directories)  # they went with the program


def test_a_preempted_node_ends_only_once_its_stop_handler_has_checkpointed(tmp_path):
    """The stop event is set before the handlers run (in another thread), so the node's code
    returns while its handler still writes: the process must wait for the handler."""
    controller = lp.launch(programs.saver_program(str(tmp_path), 'sigterm', handler_seconds=0.5),
                           launch_type='test_mp')
    assert controller.wait(timeout=60)
    found = programs.restored(str(tmp_path))
    for index in (0, 1):
        assert found['saver', index, 1]['restored'] == {'steps': 1, 'saved_by': [0]}


class _Context:
    def __init__(self, root):
        self.context = runtime.NodeContext('local_mp', 'p', 'learner', 0, None, None,
                                           checkpoint_root=root)

    def __enter__(self):
        runtime.set_thread_context(self.context)
        return self.context

    def __exit__(self, *exc):
        runtime.set_thread_context(None)


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_and_no_temporary(
        tmp_path, monkeypatch):
    with _Context(str(tmp_path)) as context:
        assert lp.load_checkpoint(default='nothing yet') == 'nothing yet'
        lp.save_checkpoint({'step': 1})
        real_fsync = os.fsync

        def crash(fd):
            real_fsync(fd)
            raise OSError('disk gone')

        monkeypatch.setattr(os, 'fsync', crash)
        with pytest.raises(OSError, match='disk gone'):
            lp.save_checkpoint({'step': 2})
        monkeypatch.setattr(os, 'fsync', real_fsync)
        assert lp.load_checkpoint() == {'step': 1}
        assert os.listdir(context.checkpoint_dir) == ['checkpoint.pkl']
        lp.save_checkpoint({'step': 3}, name='other')
        assert (lp.load_checkpoint(), lp.load_checkpoint(name='other')) == ({'step': 1},
                                                                           {'step': 3})
        with pytest.raises(ValueError, match='plain file name'):
            lp.save_checkpoint(1, name='../escape')


def test_a_program_without_a_checkpoint_directory_says_how_to_get_one():
    with _Context(None):
        with pytest.raises(RuntimeError, match='checkpoint_volume'):
            lp.save_checkpoint(1)
