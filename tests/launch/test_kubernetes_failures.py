"""Long runs on Kubernetes, with real pods under `podman kube play` (see test_kubernetes_podman):
a restarted node's pod is created again under its name (same DNS name and port), drops, hangs,
fast stops, and a pod containing every process its node started."""
from __future__ import annotations

import random
import subprocess
import threading
import time

import pytest

import launchpad as lp
from tests import failure_checks as checks
from tests import failure_programs as programs
from tests.failure_checks import wait_for
from tests.launch.test_kubernetes_podman import podman_launch  # noqa: F401  (the fixture)

# (The pods start within each test's first wait: the stand-in plays them after `create` answers.)
pytestmark = pytest.mark.timeout(240)


def kill_pod_of(controller, node: str) -> None:
    """SIGKILL to the node's container (the worker is its first process)."""
    pod = controller.status()[node].host
    subprocess.run(['podman', 'kill', '--signal', 'KILL', f'{pod}-node'], check=True,
                   capture_output=True, timeout=60)


def test_a_killed_pod_is_created_again_and_a_pod_contains_its_processes(podman_launch, capfd):
    """One launch (pods start slowly): spawner/0 starts processes and its container is killed:
    they end with it; worker/0's container is killed: its pod is created again, and prober/0's
    calls reach the new one."""
    seconds = random.randint(80000, 89999)
    program = programs.restart_program()
    with program.group('spawner', restart=lp.RestartPolicy(max_restarts=0, on_failure='drop')):
        program.add_node(lp.PyNode(programs.spawn, seconds, False))
    controller, _ = podman_launch(program)
    seen = []
    assert wait_for(lambda: seen.append(capfd.readouterr().out) or 'PROBE first answer' in
                    ''.join(seen), 150), ''.join(seen)
    assert wait_for(lambda: len(programs.sleepers(seconds)) == 3)
    kill_pod_of(controller, 'spawner/0')  # its worker cannot end them: its container does
    assert wait_for(lambda: controller.status()['spawner/0'].state is lp.NodeState.DROPPED)
    assert wait_for(lambda: programs.sleepers(seconds) == [], timeout=10)
    kill_pod_of(controller, 'worker/0')
    assert controller.wait(timeout=120)
    status = controller.status()
    assert (status['worker/0'].state, status['worker/0'].restarts) == (lp.NodeState.FINISHED, 1)
    assert 'exited with code 137' in status['worker/0'].error
    assert status['prober/0'].state is lp.NodeState.FINISHED  # it reached the new pod
    assert programs.sleepers(seconds) == []


def test_drop_hang_and_restart_budget_in_pods(podman_launch):
    controller, _ = podman_launch(programs.failure_program(deadline=2.0))
    error = checks.failed_over_budget(controller, timeout=150)
    # The launcher sees pods: each failure comes with the end of its pod's log.
    (first, stacks), (_, last_log) = error.failures
    assert 'exited with code 1' in first and 'in stuck_in_a_loop' in stacks
    assert 'hung/0 hung: no progress' in stacks
    assert 'RuntimeError: the second attempt fails too' in last_log


def test_a_stop_ends_the_pods_without_a_kill(podman_launch):
    # A kill would come after the whole notice; the pods' stop through podman took over 15 s
    # on a loaded machine (failed so once at a 30 s notice), so the notice is long.
    notice_period = 60.0
    controller, _ = podman_launch(programs.stop_program(actors=1, counting=1, calls=10 ** 9),
                                  notice_period=notice_period)
    assert wait_for(lambda: all(s.state is lp.NodeState.RUNNING
                                for s in controller.status().values()), timeout=150)
    time.sleep(1.0)
    started = time.monotonic()
    threading.Thread(target=controller.stop, daemon=True).start()
    assert wait_for(lambda: all(s.state.ended for s in controller.status().values()), 60)
    took = time.monotonic() - started
    controller.wait(timeout=60)
    states = {name: status.state for name, status in controller.status().items()}
    assert set(states.values()) == {lp.NodeState.FINISHED}, states
    assert took < notice_period / 2, f'{took:.1f} s from the stop to the end'
