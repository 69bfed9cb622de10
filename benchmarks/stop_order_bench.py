"""How a DQN-shaped program stops: seconds from `lp.stop()` to the launcher's return, and how many
nodes were killed, with the stop in graph order (callers first) and with every node told at once.

  fake   tests/stop_programs.py's program (actors -> replay <- learner, a counter, a steps
         limiter that calls lp.stop; the replay is a Reverb-like server whose clients flush on
         stop and wait for a server that is gone), on local_mp and local_mt, and with the
         learner and replay colocated. Needs nothing beyond launchpad.
  acme   Acme's distributed DQN, unchanged (acme.jax.experiments, a StepsLimiter that calls
         lp.stop), on a small gym environment. Needs dm-acme[jax], dm-reverb, gym, which the main
         environment has not; the Reverb environment of tests/reverb/run.sh is the place to add
         them. Without them it says so and exits with status 2.

Each case runs --runs times per order; the table gives the median and the worst seconds and the
nodes killed in all runs. "at once" is the stop before graph order (the coordinator given no stop
order), measured in the same invocation.

  python benchmarks/stop_order_bench.py [--program fake|acme] [--runs 3] [--notice 10]
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


def stop_once(program: lp.Program, launch_type: str, notice: float) -> Tuple[float, int]:
    """Launches `program`, which stops itself; (seconds from its stop to the launcher's return,
    nodes killed)."""
    controller = lp.launch(program, launch_type=launch_type, notice_period=notice)
    controller.wait(raise_error=False)
    ended = time.monotonic()
    stopped = controller.coordinator.stop_time
    killed = sum(status.state is lp.NodeState.KILLED for status in controller.status().values())
    return (ended - stopped if stopped is not None else float('nan')), killed


def fake_cases() -> Dict[str, Tuple[str, Callable[[], lp.Program]]]:
    from tests import stop_programs  # pylint: disable=import-outside-toplevel
    record = tempfile.mktemp(prefix='stop-order-bench-')
    return {
        'local_mp': ('local_mp', lambda: stop_programs.dqn_program(record)),
        'local_mp, learner+replay colocated': (
            'local_mp', lambda: stop_programs.dqn_program(record, colocate=True)),
        'local_mt': ('local_mt', lambda: stop_programs.dqn_program(record)),
    }


def acme_cases() -> Dict[str, Tuple[str, Callable[[], lp.Program]]]:
    """Acme's distributed DQN (`make_distributed_experiment`) on CartPole; written against
    Acme's current API and not run here: Acme cannot be installed in this environment."""
    try:
        # pylint: disable=import-outside-toplevel
        import gym
        import haiku as hk
        import reverb  # pylint: disable=unused-import
        from acme import specs, wrappers
        from acme.agents.jax import dqn
        from acme.jax import experiments
        from acme.jax import networks as networks_lib
        from acme.jax import utils
    except ImportError as e:
        print(f'Acme\'s DQN needs dm-acme[jax], dm-reverb, dm-haiku and gym, which this '
              f'environment has not ({e}). Build the Reverb environment (bash '
              'tests/reverb/run.sh --build), install them there, and run this script with its '
              'interpreter.', file=sys.stderr)
        sys.exit(2)

    def environment_factory(seed):
        del seed
        return wrappers.SinglePrecisionWrapper(wrappers.GymWrapper(gym.make('CartPole-v1')))

    def network_factory(spec: specs.EnvironmentSpec):
        def q_values(observation):
            return hk.nets.MLP([64, spec.actions.num_values])(observation)
        transformed = hk.without_apply_rng(hk.transform(q_values))
        dummy = utils.add_batch_dim(utils.zeros_like(spec.observations))
        network = networks_lib.FeedForwardNetwork(
            lambda key: transformed.init(key, dummy), transformed.apply)
        return dqn.DQNNetworks(
            policy_network=networks_lib.non_stochastic_network_to_typed(network))

    def build(colocate: bool) -> lp.Program:
        experiment = experiments.ExperimentConfig(
            builder=dqn.DQNBuilder(dqn.DQNConfig(min_replay_size=100)),
            environment_factory=environment_factory, network_factory=network_factory,
            seed=0, max_num_actor_steps=5_000)
        return experiments.make_distributed_experiment(
            experiment, num_actors=4, multithreading_colocate_learner_and_reverb=colocate)

    return {'local_mp': ('local_mp', lambda: build(False)),
            'local_mp, learner+replay colocated': ('local_mp', lambda: build(True)),
            'local_mt': ('local_mt', lambda: build(False))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--program', choices=('fake', 'acme'), default='fake')
    parser.add_argument('--runs', type=int, default=3)
    parser.add_argument('--notice', type=float, default=10.0, help='notice period, seconds')
    args = parser.parse_args()
    cases = fake_cases() if args.program == 'fake' else acme_cases()
    print(f'{"case":38} {"order":9} {"median s":>9} {"worst s":>8} {"killed":>7}')
    for case, (launch_type, build) in cases.items():
        for graph in (True, False):
            seconds: List[float] = []
            killed = 0
            with stop_order(graph):
                for _ in range(args.runs):
                    took, dead = stop_once(build(), launch_type, args.notice)
                    seconds.append(took)
                    killed += dead
            print(f'{case:38} {"graph" if graph else "at once":9} '
                  f'{statistics.median(seconds):9.2f} {max(seconds):8.2f} {killed:7d}',
                  flush=True)


if __name__ == '__main__':
    main()
