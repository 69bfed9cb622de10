"""Code a user writes against `lp.*` and `courier.*`, written to be type-checked, never run.

tests/test_typing.py runs mypy (strict) on this file, as a user's mypy sees our packages: only
their signatures count, not the errors inside them. A wrong or missing annotation in the public
API shows up here as an error, or as a type that `assert_type` does not expect.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Dict, List, Optional

from typing_extensions import assert_type

import courier
import launchpad as lp
from launchpad.dataflow import ConcatBatches, LocalIterator, ParallelRollouts
from launchpad.scaling import Decision


class Counter:
    def __init__(self) -> None:
        self.total = 0

    def add(self, n: int) -> int:
        self.total += n
        return self.total


def producer(counter: Any, n: int) -> None:
    for _ in range(n):
        counter.add(1)
    lp.stop()


def readme_program() -> None:
    program = lp.Program('hello')
    counter = program.add_node(lp.CourierNode(Counter), label='counter')
    assert_type(counter, lp.Handle[Any])
    with program.group('producer'):
        for _ in range(2):
            program.add_node(lp.PyNode(producer, counter, 10))
    controller = lp.launch(program, launch_type='local_mp')
    assert_type(controller, lp.Controller)
    assert_type(controller.wait(timeout=1.0, raise_error=False), bool)
    status = controller.status()
    assert_type(status, Dict[str, lp.NodeStatus])
    states: List[lp.NodeState] = [s.state for s in status.values()]
    del states
    controller.resize('producer', 3)
    controller.remove_node('producer/0')
    assert_type(controller.group_size('producer'), int)
    assert_type(controller.scaling_log, List[Decision])
    controller.stop_and_wait()

    several = lp.launch([lp.make_program(lp.PyNode(print)), lp.Program('other')])
    assert_type(several, lp.Controllers)
    for each in several:
        assert_type(each, lp.Controller)
    several.stop()
    assert_type(several.wait(), bool)


def a_detached_program(program: lp.Program) -> None:
    controller = lp.launch(program, launch_type='local_mp', detach=True, supervisor_grace=300)
    assert_type(controller, lp.Controller)
    attached = lp.attach('hello')
    assert_type(attached, lp.AttachedController)
    assert_type(attached.id, str)
    assert_type(attached.add_node(lp.PyNode(print), 'producer'), lp.Handle[Any])
    attached.resize('producer', 3)
    assert_type(attached.wait(timeout=1.0), bool)
    attached.stop()


def nodes_and_options(handle: lp.CourierHandle) -> lp.Program:
    program = lp.Program('nodes')
    cache = program.add_node(lp.CacherNode(handle, refresh_interval_ms=500), label='cache')
    program.add_node(lp.MultiThreadingColocation([lp.PyNode(print, cache)]), label='threads')
    program.add_node(lp.MultiProcessingColocation([lp.PyNode(print)], num_retries_on_failure=1))
    program.add_node(lp.ColocationNode([lp.PyClassNode(Counter)], mode='processes'))
    policy = lp.RestartPolicy(max_restarts=3, window=600, backoff=1.0, on_failure='drop')
    with program.group('learner', restart=policy, progress_deadline=60.0):
        program.add_node(lp.PyNode(print))

    def make_actor() -> lp.CourierNode:
        return lp.CourierNode(Counter)

    with program.group('actor', elastic=lp.Elastic(make_node=make_actor, min_size=1, max_size=4,
                                                    budget=100.0)):
        program.add_node(make_actor())
    program.add_node(lp.PyNode(print, program.group_handle('actor')), label='sync')
    program.set_scaling_policy(lp.ProgressPerActorPolicy('actor', 'learner', 'avg_return'))
    program.set_scaling_policy(lp.QueueLengthPolicy('actor', 'backlog', per_node=5))
    address = lp.Address()
    lp.PyNode(print).allocate_address(address)
    lp.launch(program, launch_type=lp.LaunchType.LOCAL_MULTI_PROCESSING, dashboard=True,
              local_resources={'learner': lp.PythonProcess(env={'CUDA_VISIBLE_DEVICES': '0'})},
              terminal='output_to_files', notice_period=5.0,
              tls=courier.TLSConfig(certificate_chain=b'...', private_key=b'...'))
    lp.launch(program, launch_type='ssh', resources={
        'learner': lp.SshHost('gpu-box', python='/opt/venv/bin/python'),
        'actor': lp.SshHosts(['cpu-1', 'cpu-2'], python='/opt/venv/bin/python')})
    lp.launch(program, launch_type='slurm', resources={
        'learner': lp.SlurmResources(cpus=8, mem='32G', gpus=1, time='4:00:00')})
    lp.launch(program, launch_type='kubernetes', image='registry.example/agent:v1',
              resources={'learner': lp.KubernetesResources(gpus=1, memory='16Gi')})
    lp.program_to_manifests(program, image='registry.example/agent:v1', path='agent.yaml')
    assert_type(program.to_dot(), str)
    return program


def inside_a_node(actors: lp.GroupClient) -> None:
    context = lp.get_context()
    assert_type(context.launch_type, str)  # an lp.LaunchType, or a registered launcher's name
    assert context.launch_type == lp.LaunchType.LOCAL_MULTI_PROCESSING
    assert_type(context.attempt, int)
    lp.report(avg_return=1.5, loss=0.1)
    lp.count(env_steps=500)
    lp.heartbeat()
    lp.resize('actor', 6)
    assert_type(lp.wait_for_stop(1.0), bool)
    assert_type(lp.stop_event(), threading.Event)
    lp.register_stop_handler(lambda: None)
    assert_type(actors.names(), List[str])
    assert_type(len(actors), int)
    assert_type(actors.wait_for_change(timeout=0), bool)
    results = actors.call_all('sample', 2, timeout=5.0)
    del results
    try:
        actors.call_any('sample')
    except lp.NodeLeftError:
        pass
    assert_type(lp.get_port_from_address('localhost:80'), int)


def square(x: int) -> int:
    return x * x


def pools_and_dataflows(workers: List[courier.Client], actors: lp.GroupClient,
                        rollout_workers: List[courier.Client]) -> None:
    with lp.Pool(2, launch_type='local_mp') as pool:
        squares: List[Any] = pool.map(square, range(10))
        del squares
        future = pool.apply_async(square, (3,))
        assert_type(future.get(timeout=10.0), Any)
        for value in pool.imap_unordered(square, range(3)):
            del value
    lp.Pool(workers=workers).close()
    lp.Pool(workers=actors).terminate()
    rollouts = ParallelRollouts(rollout_workers, mode='async')
    batches = rollouts.combine(ConcatBatches(min_batch_size=200))
    raw = ParallelRollouts(rollout_workers, mode='raw')
    assert_type(raw.gather_sync(), LocalIterator[Any])
    for batch in batches:
        del batch
        break


def courier_alone() -> None:
    server = courier.Server()
    server.Bind('add', lambda x, y: x + y)
    server.Start()
    client = courier.Client(server.address)
    assert_type(client.add(2, 3), Any)
    future = client.futures.add(4, 5)
    assert_type(future, concurrent.futures.Future[Any])
    assert_type(courier.list_methods(client), List[str])
    with courier.Client(server.address, call_timeout=1.0) as timed:
        try:
            timed.add(1, 2)
        except courier.CallTimeoutError as error:
            assert_type(error, courier.CallTimeoutError)
        except courier.RemoteError:
            pass
    server.Stop()

    @courier.batched_handler(batch_size=8, timeout=0.2)
    def double(values: List[int]) -> List[int]:
        return [2 * v for v in values]

    del double
    token: Optional[str] = courier.AUTH_TOKEN_ENV
    del token
