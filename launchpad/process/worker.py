"""The entry point of every node process: `python -m launchpad.process.worker SPEC_FILE`.

A launcher packs a `WorkerSpec` (the executable, the address table, how to reach the coordinator)
with `launchpad.process.spec`, ships the file to where the process runs and starts this module on
it (`spec.worker_argv`). The worker installs the node's context, watches the coordinator for the
stop signal (and for the launcher going away), runs the executable and reports how it ended.

Nothing imports this module: it only runs as a program's main module.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import threading
import time

import courier

from launchpad import runtime
from launchpad.observe import report
from launchpad.process import flags
from launchpad.process import spec as specs
from launchpad.process.coordinator import COORDINATOR_LOSS_TIMEOUT, run_reporting
from launchpad.process.spec import WorkerSpec

_POLL = 1.0


def _run_with_flags(spec: WorkerSpec) -> None:
    flags.install(spec.flags, spec.flag_overrides)
    spec.run()


def _watch(coordinator, stop: runtime.StopSignal, spec: WorkerSpec,
           launcher_lost: threading.Event) -> None:
    """Triggers the stop signal when the program stops or the launcher is gone."""
    unreachable_since = None
    while True:
        if spec.parent_pid is not None and os.getppid() != spec.parent_pid:
            logging.error('%s: the launcher (pid %d) is gone; stopping.', spec.node_name,
                          spec.parent_pid)
            launcher_lost.set()
            break
        try:
            if coordinator.wait_for_stop(_POLL):
                break
            unreachable_since = None
        except Exception as e:  # pylint: disable=broad-except
            now = time.monotonic()
            unreachable_since = unreachable_since or now
            if now - unreachable_since > COORDINATOR_LOSS_TIMEOUT:
                logging.error('%s: the program\'s coordinator has been unreachable for %.0f s (%s); '
                              'stopping.', spec.node_name, COORDINATOR_LOSS_TIMEOUT, e)
                launcher_lost.set()
                break
            time.sleep(0.2)
    stop.trigger()
    time.sleep(spec.notice_period + 1.0)
    logging.error('%s did not end within the %g s notice period; exiting.', spec.node_name,
                  spec.notice_period)
    _exit_now(3, spec, launcher_lost)


def _exit_now(code: int, spec: WorkerSpec, launcher_lost: threading.Event) -> None:
    if launcher_lost.is_set() and spec.cleanup_dir:
        shutil.rmtree(spec.cleanup_dir, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


def main() -> None:
    """Runs the executable of the spec file named by the last command-line argument, then exits."""
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
    if len(sys.argv) != 2:
        sys.exit(f'usage: python -m {specs.WORKER_MODULE} SPEC_FILE')
    sys.exit(_run(sys.argv[1]))


def _run(spec_path: str) -> int:
    spec = specs.load(spec_path)
    label, index = spec.node_name.rsplit('/', 1)
    context = runtime.NodeContext(
        launch_type=spec.launch_type, program_name=spec.program_name, label=label,
        index=int(index) if index.isdigit() else 0, address_table=spec.address_table, stop=None,
        notice_period=spec.notice_period, tls=spec.tls)
    tls = context.tls_for(spec.coordinator_address)
    # The start waits for a busy coordinator; everything later fails at once when it is gone, so
    # that a node whose launcher died ends within seconds.
    starting = courier.Client(spec.coordinator_address, call_timeout=30.0, wait_for_ready=True,
                              tls=tls)
    coordinator = courier.Client(spec.coordinator_address, call_timeout=30.0, wait_for_ready=False,
                                 tls=tls)
    # Address lookups wait for servers to come up, longer than other calls may take.
    table = spec.address_table
    lookup_deadline = None if table.lookup_timeout is None else table.lookup_timeout + 30.0
    table.registry = courier.Client(spec.coordinator_address, call_timeout=lookup_deadline,
                                    wait_for_ready=False, tls=tls)
    stop = runtime.StopSignal(coordinator.request_stop)
    context.stop, context.coordinator = stop, coordinator
    runtime.set_process_context(context)
    report.start_reporting(spec.node_name, courier.Client(
        spec.coordinator_address, call_timeout=report.REPORT_TIMEOUT, wait_for_ready=False,
        tls=tls))
    launcher_lost = threading.Event()
    threading.Thread(target=_watch, args=(coordinator, stop, spec, launcher_lost), daemon=True,
                     name='lp-stop-watcher').start()
    try:
        code = run_reporting(functools.partial(_run_with_flags, spec), spec.node_name, coordinator,
                             starting=starting)
    except Exception:  # pylint: disable=broad-except
        # Reporting failed: the coordinator is gone.
        logging.exception('%s could not report to the coordinator.', spec.node_name)
        code = 1
    if launcher_lost.is_set():
        _exit_now(code, spec, launcher_lost)
    return code


if __name__ == '__main__':
    main()
