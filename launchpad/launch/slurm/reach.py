"""Reaching a detached Slurm program's driver from the login node.

The in-job driver (driver.py) serves the program's observer, with the control that
`lp.attach` uses, on a Unix socket of the job's batch host, in a registry private to the job
(`runtime_dir`: node-local, so that the launching machine's own registry, even on a shared
filesystem, never holds the same program twice). It publishes its registry entry to the run
directory (`publish`); the launcher waits for it and registers the program on the launching
machine (`adopt`), with a relay command (`relay_command`) by which `launchpad.observe.tunnel`
reaches that socket: a step of the program's own job on its batch host,

    srun --jobid=JOB --overlap --nodelist=BATCHHOST ... python relay.py SOCKET

whose stdin and stdout `launchpad.observe.relay` joins to the socket. Why a step rather than
ssh: compute nodes often refuse ssh, or accept it only into a node where the user has a job
(pam_slurm_adopt); a step in the user's own running job is always allowed, is authenticated
by Slurm (munge), and `--overlap` lets it share the CPUs the nodes' steps hold.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import List

from launchpad.launch.slurm import job, shared
from launchpad.observe import registry
from launchpad.observe import relay
from launchpad.process import logs

# The driver's entry, as the launching machine registers it, in the run directory.
SUPERVISOR_FILE = 'supervisor.json'

# Arguments: JOB NODE GRACE RELAY_ARGV... Says `gone` (for the tunnel) once the job has ended;
# while it runs, runs the relay as a step of the job on NODE, again while no driver's socket
# is there (a new driver replaces a killed one), for up to GRACE seconds.
_RELAY_SCRIPT = f'''job=$1 node=$2 grace=$3
shift 3
ended() {{
  out=$(squeue --noheader --jobs="$job" --states=all --format=%T 2>&1) || case $out in
    *"Invalid job id"*) return 0;;
    *) echo "$out" >&2; exit 1;;
  esac
  case $out in *RUNNING*) return 1;; *) return 0;; esac
}}
deadline=$(($(date +%s) + grace))
while ! ended; do
  srun --jobid="$job" --overlap --nodelist="$node" --nodes=1 --ntasks=1 --unbuffered \\
    --quiet --job-name=launchpad-relay "$@"
  code=$?
  [ "$code" -eq {relay.ABSENT} ] || exit "$code"
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "no driver of Slurm job $job has served its program for $grace s" >&2
    exit 1
  fi
  sleep 0.5
done
echo gone'''


def runtime_dir() -> str:
    """The shell expression, in the batch script, of the driver's private registry directory
    on the batch host: one per job and user, removed when the job's script ends."""
    return '"${TMPDIR:-/tmp}/launchpad-slurm-$(id -u)-$SLURM_JOB_ID"'


def relay_command(job_id: str, node: str, socket_path: str) -> List[str]:
    """The command that relays its stdin and stdout to the observer socket `socket_path` on
    `node`, through a step of job `job_id` (see the module docstring)."""
    return ['sh', '-c', _RELAY_SCRIPT, 'launchpad-relay', job_id, node,
            str(int(shared.DRIVER_GRACE)), sys.executable, relay.__file__, relay.ABSENT_EXITS,
            socket_path]


def publish(run_dir: str, entry: registry.Entry) -> None:
    """(The driver) Writes its registry entry to the run directory for the launcher, with the
    Slurm name of its node; only its user can read it (it holds the observer's token)."""
    fields = {**dataclasses.asdict(entry),
              'host': os.environ.get('SLURMD_NODENAME') or entry.host}
    path = os.path.join(run_dir, SUPERVISOR_FILE)
    partial = path + '.tmp'
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'w') as f:
        json.dump(fields, f)
    os.replace(partial, path)


def adopt(run_dir: str, job_id: str, batch_log: str, timeout: float) -> registry.Entry:
    """(The launcher) Waits up to `timeout` seconds for the driver of job `job_id` to publish
    its entry, and registers the program on this machine, reached through `relay_command`.

    Raises:
      RuntimeError: the job ended first (its output says why); TimeoutError.
    """
    path = os.path.join(run_dir, SUPERVISOR_FILE)
    deadline = time.monotonic() + timeout
    checked = 0.0
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f'The driver of Slurm job {job_id} did not start within '
                               f'{timeout:g} s; see {batch_log}.')
        if time.monotonic() - checked > 1.0:
            checked = time.monotonic()
            if job.ended(job.states(job_id)):
                raise RuntimeError(f'Slurm job {job_id} ended before its driver served the '
                                   f'program; its output ({batch_log}):\n'
                                   + '\n'.join(logs.read_file(batch_log)[0]))
        time.sleep(0.05)
    with open(path) as f:
        fields = json.load(f)
    socket_path = fields['address'].split(':', 1)[1]
    entry = registry.Entry(**{**fields, 'job': job_id, 'relay': relay_command(
        job_id, fields['host'], socket_path)})
    registry.register(entry)
    return entry

