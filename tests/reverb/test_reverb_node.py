"""ReverbNode for real: actors insert through the node's handle, a learner samples.

Needs dm-reverb and TensorFlow (tests/reverb/run.sh builds an environment with them). Elsewhere the
module is skipped, unless LAUNCHPAD_REVERB=required, which makes a missing Reverb a failure.
"""
import functools
import os
import tempfile

import numpy as np
import psutil
import pytest

import launchpad as lp
from launchpad.nodes.reverb import missing_reverb_message

from tests.core.conftest import wait_until
from tests.leftovers import temp_dirs
from tests.nodes.conftest import launch_and_wait

if missing_reverb_message() and os.environ.get('LAUNCHPAD_REVERB') != 'required':
    pytest.skip(f'{missing_reverb_message()} tests/reverb/run.sh builds such an environment.',
                allow_module_level=True)

import reverb  # pylint: disable=wrong-import-position

TABLE = 'replay'
ACTORS = 2
STEPS = 10
LAUNCH_TYPES = ['test_mt', 'local_mp']


def make_tables():
    return [reverb.Table(name=TABLE, sampler=reverb.selectors.Uniform(),
                         remover=reverb.selectors.Fifo(), max_size=1000,
                         rate_limiter=reverb.rate_limiters.MinSize(1))]


def make_checkpointer(path):
    return reverb.checkpointers.DefaultCheckpointer(path=path)


def actor(replay, actor_id):
    assert isinstance(replay, reverb.Client), type(replay)
    for step in range(STEPS):
        replay.insert([np.array([actor_id, step], np.int64)], priorities={TABLE: 1.0})


def learner(replay, checkpoint_dir):
    assert isinstance(replay, reverb.Client), type(replay)
    assert wait_until(lambda: replay.server_info()[TABLE].current_size == ACTORS * STEPS,
                      timeout=60), replay.server_info()[TABLE]
    inserted = {(a, s) for a in range(ACTORS) for s in range(STEPS)}
    for timesteps in replay.sample(TABLE, num_samples=20):
        actor_id, step = timesteps[0].data[0]
        assert (actor_id, step) in inserted
    if checkpoint_dir is not None:  # the node checkpoints by itself, every 0.3 s
        assert wait_until(lambda: os.path.isdir(checkpoint_dir) and os.listdir(checkpoint_dir),
                          timeout=30)
    lp.stop()


def actor_learner_program(colocate, checkpoint_dir=None):
    """Acme's layout: the replay node's handle is made first; the learner may share its process."""
    program = lp.Program('actor_learner')
    if checkpoint_dir is None:
        replay_node = lp.ReverbNode(make_tables)
    else:
        replay_node = lp.ReverbNode(make_tables,
                                    functools.partial(make_checkpointer, checkpoint_dir),
                                    checkpoint_time_delta_minutes=0.005)
    replay = replay_node.create_handle()
    learner_node = lp.PyNode(learner, replay, checkpoint_dir)
    if colocate:
        program.add_node(lp.MultiThreadingColocation([learner_node, replay_node]), label='learner')
    else:
        program.add_node(replay_node, label='replay')
        program.add_node(learner_node, label='learner')
    with program.group('actor'):
        for actor_id in range(ACTORS):
            program.add_node(lp.PyNode(actor, replay, actor_id))
    return program


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_actors_insert_and_the_learner_samples(launch_type):
    controller = launch_and_wait(actor_learner_program(colocate=False), launch_type,
                                 timeout=120, notice_period=10)
    assert all(status.state is lp.NodeState.FINISHED for status in controller.status().values())


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_learner_colocated_with_replay_and_checkpoints(launch_type, tmp_path):
    program = actor_learner_program(colocate=True, checkpoint_dir=str(tmp_path / 'checkpoints'))
    launch_and_wait(program, launch_type, timeout=120, notice_period=10)


def test_a_killed_replay_node_leaves_no_checkpoint_directory():
    """A ReverbNode without a checkpointer of its own checkpoints into a temporary directory;
    SIGKILLed (or killed at the end of its notice period: no `finally` runs either way), it
    leaves none behind: the directory is in the program's run directory, which goes with it."""
    before = temp_dirs()
    program = lp.Program('killed_replay')
    program.add_node(lp.ReverbNode(make_tables), label='replay')
    controller = lp.launch(program, launch_type='local_mp')
    try:
        assert wait_until(lambda: controller.status()['replay/0'].state is lp.NodeState.RUNNING,
                          timeout=60)
        replay = psutil.Process(controller.status()['replay/0'].pid)
        assert wait_until(lambda: any(  # its checkpointer's directory is made
            os.path.basename(path).startswith(('launchpad-reverb-', 'reverb-'))
            for path, _, _ in os.walk(tempfile.gettempdir())), timeout=60)
        replay.kill()
        with pytest.raises(lp.NodeFailedError, match='replay/0'):  # (else its exit fails)
            controller.wait(timeout=60)
    finally:
        controller.stop()
    assert 'killed by signal 9' in controller.status()['replay/0'].error
    assert not temp_dirs() - before
