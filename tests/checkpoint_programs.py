"""Programs whose nodes checkpoint and restore across their attempts (tests/core/test_checkpoints.py
runs them on threads and processes, tests/launch/test_slurm_requeue.py on a requeued Slurm job)."""
import json
import os
import signal
import time

import launchpad as lp


def saver(results: str, how: str, attempts: int = 1, handler_seconds: float = 0.0) -> None:
    """Records what each attempt restored. Attempts before `attempts` checkpoint in their stop
    handler, then end as `how` says: 'sigterm' (a preemption of this node), 'crash' (after a
    checkpoint of its own, for threads, which cannot be preempted) or 'wait' (for the program's
    stop or the platform's requeue). The stop handler takes `handler_seconds` before it saves."""
    context = lp.get_context()
    state = lp.load_checkpoint(default={'steps': 0, 'saved_by': []})
    record = {'attempt': context.attempt, 'restored': json.loads(json.dumps(state)),
              'checkpoint_dir': context.checkpoint_dir}
    if context.attempt < attempts:
        state['steps'] += 1

        def save_on_stop():
            time.sleep(handler_seconds)
            state['saved_by'].append(context.attempt)
            lp.save_checkpoint(state)

        lp.register_stop_handler(save_on_stop)
    with open(os.path.join(results, f'{context.label}-{context.index}-{context.attempt}.json'),
              'w') as f:
        json.dump(record, f)
    if context.attempt >= attempts:
        return
    if how == 'sigterm':
        os.kill(os.getpid(), signal.SIGTERM)
    elif how == 'crash':
        save_on_stop()
        raise RuntimeError('crashed after its checkpoint')
    lp.wait_for_stop()


def saver_program(results: str, how: str, nodes: int = 2, restart: bool = True,
                  attempts: int = 1, handler_seconds: float = 0.0) -> lp.Program:
    """`nodes` savers; without `restart` a failure fails the program (a requeue is none)."""
    program = lp.Program('checkpoints')
    policy = lp.RestartPolicy(max_restarts=1, backoff=0.1) if restart else None
    with program.group('saver', restart=policy):
        for _ in range(nodes):
            program.add_node(lp.PyNode(saver, results, how, attempts, handler_seconds))
    return program


def restored(results: str) -> dict:
    """(label, index, attempt) -> what that attempt recorded."""
    found = {}
    for name in os.listdir(results):
        label, index, attempt = name[:-len('.json')].rsplit('-', 2)
        with open(os.path.join(results, name)) as f:
            found[label, int(index), int(attempt)] = json.load(f)
    return found
