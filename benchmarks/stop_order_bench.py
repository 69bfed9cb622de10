"""How a DQN-shaped program stops: seconds from `lp.stop()` to the launcher's return, and how many
nodes were killed, with the stop in graph order (callers first) and with every node told at once.

  fake   tests/stop_programs.py's program (actors -> replay <- learner, a counter, a steps
         limiter that calls lp.stop; the replay is a Reverb-like server whose clients flush on
         stop and wait for a server that is gone), on local_mp and local_mt, and with the
         learner and replay colocated. Needs nothing beyond launchpad.
  acme   Acme's distributed DQN, unchanged: dm-acme 0.4.0 (the package index's newest Acme)
         builds it with its `DistributedLayout` and `DQNBuilder`; a StepsLimiter node logs
         "terminating" and calls lp.stop() once the actors took --acme_steps steps, on gym's
         CartPole. The stop is timed from the coordinator's receipt of that lp.stop(). It needs
         dm-acme, dm-reverb 0.7, TensorFlow 2.8 and JAX, which the project never depends on:
         `bash benchmarks/acme_env.sh VENV` builds their environment (the pins are in
         benchmarks/acme_requirements.txt), and VENV/bin/python runs this script. Without them
         it says so and exits with status 2.
         (Acme 0.4.0 needs dm-reverb 0.7's trajectory_writer(get_signature_timeout_ms=...),
         hence TensorFlow 2.8 and CPython 3.9; the oldest jaxlib served is 0.4.13, for which
         acme_env.sh restores the two jax names that Acme 0.4.0 reads.)

Each case runs --runs times per order; the table gives the median and the worst seconds and the
nodes killed in all runs. "at once" is the stop before graph order (the coordinator given no stop
order), measured in the same invocation; the inner nodes of a thread colocation keep their own
graph order then (`launchpad.nodes.inner_threads`, in the node's process, out of this script's
reach). --case picks cases by their name in the table.

  python benchmarks/stop_order_bench.py [--program fake|acme] [--runs 3] [--notice 10]
                                        [--orders both|graph|at-once] [--acme_actors 4]
                                        [--acme_steps 5000] [--case CASE ...]
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import launchpad as lp  # pylint: disable=wrong-import-position
from launchpad.launch import launcher  # pylint: disable=wrong-import-position


@contextlib.contextmanager
def stop_order(graph: bool):
    """The stop in graph order (the default), or every node told at once (no stop order)."""
    original = launcher.stop_order_of
    if not graph:
        launcher.stop_order_of = lambda *args: None
    try:
        yield
    finally:
        launcher.stop_order_of = original


def stop_once(program: lp.Program, launch_type: str, notice: float) -> Tuple[float, int, str]:
    """Launches `program`, which stops itself; (seconds from its stop to the launcher's return,
    nodes killed, the nodes that did not end finished, with their state)."""
    controller = lp.launch(program, launch_type=launch_type, notice_period=notice)
    controller.wait(raise_error=False)
    ended = time.monotonic()
    stopped = controller.coordinator.stop_time
    states = {name: status.state for name, status in controller.status().items()}
    killed = sum(state is lp.NodeState.KILLED for state in states.values())
    others = ', '.join(f'{name} {state.value}' for name, state in states.items()
                       if state is not lp.NodeState.FINISHED)
    return (ended - stopped if stopped is not None else float('nan')), killed, others


def fake_cases(scratch: str) -> Dict[str, Tuple[str, Callable[[], lp.Program]]]:
    from tests import stop_programs  # pylint: disable=import-outside-toplevel
    record = str(pathlib.Path(scratch) / 'flushed')
    return {
        'local_mp': ('local_mp', lambda: stop_programs.dqn_program(record)),
        'local_mp, learner+replay colocated': (
            'local_mp', lambda: stop_programs.dqn_program(record, colocate=True)),
        'local_mt': ('local_mt', lambda: stop_programs.dqn_program(record)),
    }


def acme_cases(actors: int, steps: int, checkpoints: str
               ) -> Dict[str, Tuple[str, Callable[[], lp.Program]]]:
    """Acme's distributed DQN as dm-acme 0.4.0 (the index's newest) builds it: its
    `DistributedLayout` with `DQNBuilder`, whose program has a StepsLimiter node that logs
    "terminating" and calls `lp.stop()` once the `actors` took `steps` steps. Each program
    checkpoints into a fresh directory under `checkpoints`: one that restored the counter of an
    earlier run would stop at once, while its nodes still start."""
    try:
        # pylint: disable=import-outside-toplevel
        import gym
        import haiku as hk
        import reverb  # pylint: disable=unused-import
        from acme import specs, wrappers
        from acme.agents.jax import dqn
        from acme.jax import networks as networks_lib
        from acme.jax import utils
        from acme.jax.layouts import distributed_layout
    except ImportError as e:
        print(f'Acme\'s DQN needs dm-acme 0.4.0 and what benchmarks/acme_requirements.txt names, '
              f'which this environment has not ({e}). Build their environment with bash '
              'benchmarks/acme_env.sh VENV and run this script with VENV/bin/python.',
              file=sys.stderr)
        sys.exit(2)

    def environment_factory(seed):
        del seed
        return wrappers.SinglePrecisionWrapper(wrappers.GymWrapper(gym.make('CartPole-v1')))

    def network_factory(spec: specs.EnvironmentSpec) -> networks_lib.FeedForwardNetwork:
        def q_values(observation):
            return hk.nets.MLP([64, spec.actions.num_values])(observation)
        transformed = hk.without_apply_rng(hk.transform(q_values))
        dummy = utils.add_batch_dim(utils.zeros_like(spec.observations))
        return networks_lib.FeedForwardNetwork(
            lambda key: transformed.init(key, dummy), transformed.apply)

    def build(colocate: bool) -> lp.Program:
        config = dqn.DQNConfig(min_replay_size=100, batch_size=32)
        loss = dqn.PrioritizedDoubleQLearning(
            discount=config.discount,
            importance_sampling_exponent=config.importance_sampling_exponent)
        return distributed_layout.DistributedLayout(
            seed=0, environment_factory=environment_factory, network_factory=network_factory,
            builder=dqn.DQNBuilder(config, loss_fn=loss), policy_network=dqn.behavior_policy,
            num_actors=actors, max_number_of_steps=steps,
            multithreading_colocate_learner_and_reverb=colocate,
            checkpointing_config=distributed_layout.CheckpointingConfig(
                directory=tempfile.mkdtemp(dir=checkpoints), add_uid=True)).build(name='dqn')

    return {'local_mp': ('local_mp', lambda: build(False)),
            'local_mp, learner+replay colocated': ('local_mp', lambda: build(True)),
            'local_mt': ('local_mt', lambda: build(False))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--program', choices=('fake', 'acme'), default='fake')
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--notice', type=float, default=10.0, help='notice period, seconds')
    parser.add_argument('--orders', choices=('both', 'graph', 'at-once'), default='both')
    parser.add_argument('--acme_actors', type=int, default=4)
    parser.add_argument('--acme_steps', type=int, default=5_000,
                        help='actor steps after which Acme\'s StepsLimiter stops the program')
    parser.add_argument('--case', action='append', default=[],
                        help='run only this case (its name in the table; repeat for several)')
    args = parser.parse_args()
    orders = {'both': (True, False), 'graph': (True,), 'at-once': (False,)}[args.orders]
    with tempfile.TemporaryDirectory(prefix='stop-order-bench-') as scratch:
        cases = (fake_cases(scratch) if args.program == 'fake'
                 else acme_cases(args.acme_actors, args.acme_steps, scratch))
        print(f'{"case":38} {"order":9} {"median s":>9} {"worst s":>8} {"killed":>7}')
        for case, (launch_type, build) in cases.items():
            if args.case and case not in args.case:
                continue
            for graph in orders:
                seconds: List[float] = []
                killed = 0
                with stop_order(graph):
                    for _ in range(args.runs):
                        took, dead, others = stop_once(build(), launch_type, args.notice)
                        seconds.append(took)
                        killed += dead
                        print(f'  {case}, {"graph" if graph else "at once"}: {took:.2f} s, '
                              f'{dead} killed{"; " + others if others else ""}',
                              file=sys.stderr, flush=True)
                print(f'{case:38} {"graph" if graph else "at once":9} '
                      f'{statistics.median(seconds):9.2f} {max(seconds):8.2f} {killed:7d}',
                      flush=True)


if __name__ == '__main__':
    main()
