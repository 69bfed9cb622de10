"""The test beds work for real and leave nothing behind (run as root; see tests/testbeds)."""
from __future__ import annotations

import contextlib
import pathlib
import shlex
import shutil
import subprocess
import textwrap
import time

import psutil
import pytest

from tests import testbeds

pytestmark = pytest.mark.timeout(120, func_only=True)  # (not the wait for a bed another holds)

REPORT_ADDRESS = textwrap.dedent('''
    import socket
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(("10.200.0.1", 9))  # UDP connect picks the source address; nothing is sent
    print(socket.gethostname(), probe.getsockname()[0])
''')


@pytest.fixture(autouse=True)
def hold_beds(request):
    """Keeps other processes (other test sessions on this machine) away from the beds a test
    names with @pytest.mark.holds, so that what it checks after a bed went down is its own."""
    marker = request.node.get_closest_marker('holds')
    with contextlib.ExitStack() as stack:
        for bed in marker.args if marker else ():
            stack.enter_context(testbeds.holding(bed))
        yield


def run(argv: list[str], timeout: float = 30) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f'{shlex.join(argv)} failed: {done.stderr}'
    return done.stdout


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_network_released(bed: str) -> None:
    """The bed no longer uses the shared network, which is gone unless another bed (maybe of
    another test session on this machine) still uses it."""
    users = sorted(p.name for p in testbeds.NET_REGISTRY.glob('*'))
    assert bed not in users
    if not users:
        assert 'lp-h' not in run(['ip', 'netns', 'list'])
        assert not pathlib.Path('/sys/class/net/lpbr0').exists()
        assert '# lp-testbed' not in pathlib.Path('/etc/hosts').read_text()


def ssh_report(host: testbeds.SshHost) -> list[str]:
    return run(host.ssh_command(shlex.join([host.python, '-c', REPORT_ADDRESS]))).split()


def srun_hostnames(*args: str) -> list[str]:
    return run(['srun', *args], timeout=60).split()


def start_sleeping_job(directory: pathlib.Path, *sbatch_args: str) -> tuple[str, int]:
    """Submits a job that sleeps; returns its id and the pid of its script once that runs."""
    pidfile = directory / 'job.pid'
    job = run(['sbatch', '--parsable', '--output=/dev/null', *sbatch_args,
               '--wrap', f'echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 300'])
    deadline = time.monotonic() + 60  # (slurmctld schedules slowly on a loaded machine)
    while time.monotonic() < deadline:
        if pidfile.exists():
            return job.strip(), int(pidfile.read_text())
        time.sleep(0.05)
    raise AssertionError(f'job {job.strip()} did not start within 60 s: '
                         f'{run(["squeue", "-h", "-j", job.strip(), "-o", "%T %r"]).strip()}')


# --- SSH -----------------------------------------------------------------------------------

@pytest.mark.holds('ssh')
def test_ssh_hosts_have_own_hostname_and_address_and_leave_nothing():
    with testbeds.ssh_hosts(3) as hosts:
        reports = [ssh_report(host) for host in hosts]
        assert reports == [[host.name, host.ip] for host in hosts]
        assert len({name for name, _ in reports}) == 3
        # Plain OpenSSH with the user's ~/.ssh/config works too, by name.
        assert run(['ssh', 'lp-h3', 'hostname']).strip() == 'lp-h3'
        # A daemonised process outlives its session; `down` must still end it.
        orphan = int(run(hosts[1].ssh_command('nohup sleep 300 >/dev/null 2>&1 & echo $!')))
        assert alive(orphan)
    assert not alive(orphan)
    assert testbeds.leftovers('ssh') == []
    assert_network_released('ssh')


def test_ssh_host_server_is_reachable_from_other_hosts():
    server = 'import socket; s = socket.create_server(("", 7000)); c, _ = s.accept(); c.sendall(b"pong")'
    client = ('import socket; c = socket.create_connection(("lp-h1", 7000), timeout=5); '
              'print(c.recv(10).decode())')
    with testbeds.ssh_hosts(2) as (h1, h2):
        serving = subprocess.Popen(h1.ssh_command(shlex.join([h1.python, '-c', server])))
        try:
            for _ in range(50):
                done = subprocess.run(h2.ssh_command(shlex.join([h2.python, '-c', client])),
                                      capture_output=True, text=True, timeout=10)
                if done.returncode == 0:
                    break
            assert done.stdout.strip() == 'pong'
            assert serving.wait(timeout=10) == 0
        finally:
            serving.kill()  # the ssh client only; the bed's down ends the remote side
            serving.wait()


# --- Slurm ---------------------------------------------------------------------------------

@pytest.mark.holds('slurm')
def test_slurm_single_runs_a_step_and_leaves_nothing(tmp_path):
    with testbeds.slurm_cluster('single') as cluster:
        assert srun_hostnames('-N1', 'hostname') == list(cluster.nodes)
        job, sleeper = start_sleeping_job(tmp_path)
        assert alive(sleeper)
        assert run(['squeue', '-h', '-j', job, '-o', '%T']).strip() == 'RUNNING'
    assert not alive(sleeper)
    assert testbeds.leftovers('slurm') == []


@pytest.mark.holds('slurm')
def test_slurm_multi_spreads_steps_and_heterogeneous_components_over_nodes(tmp_path):
    with testbeds.slurm_cluster('multi', 3) as cluster:
        assert sorted(srun_hostnames('-N3', 'hostname')) == list(cluster.nodes)
        components = srun_hostnames('-N1', 'hostname', ':', '-N1', 'hostname')
        assert len(components) == 2 and len(set(components)) == 2
        assert set(components) <= set(cluster.nodes)
        job, sleeper = start_sleeping_job(tmp_path, '-w', 'lp-h2')
        assert alive(sleeper)
        assert srun_hostnames('--jobid', job, '--overlap', 'hostname') == ['lp-h2']
    assert not alive(sleeper)
    assert testbeds.leftovers('slurm') == []
    assert_network_released('slurm')


# --- SSH and multi-node Slurm share the network ----------------------------------------------

@pytest.mark.holds('ssh', 'slurm')
def test_ssh_bed_can_go_down_before_slurm_multi():
    with contextlib.ExitStack() as outer:
        ssh = testbeds.ssh_hosts(3)
        hosts = ssh.__enter__()
        outer.callback(ssh.__exit__, None, None, None)
        with testbeds.slurm_cluster('multi', 3) as cluster:
            assert ssh_report(hosts[0]) == ['lp-h1', '10.200.0.2']
            outer.close()  # SSH bed down while Slurm still uses the network
            assert testbeds.leftovers('ssh') == []
            assert sorted(srun_hostnames('-N3', 'hostname')) == list(cluster.nodes)
    assert testbeds.leftovers('slurm') == []
    assert_network_released('slurm')


@pytest.mark.holds('ssh', 'slurm')
def test_slurm_multi_can_go_down_before_ssh_bed():
    with testbeds.slurm_cluster('multi', 3) as cluster:
        assert srun_hostnames('-N1', '-w', 'lp-h3', 'hostname') == ['lp-h3']
        ssh = testbeds.ssh_hosts(3)
        hosts = ssh.__enter__()
    try:
        assert testbeds.leftovers('slurm') == []
        assert [ssh_report(host) for host in hosts] == [[h.name, h.ip] for h in hosts]
    finally:
        ssh.__exit__(None, None, None)
    assert testbeds.leftovers('ssh') == []
    assert_network_released('ssh')


# --- podman --------------------------------------------------------------------------------

ECHO_PODS = '''
apiVersion: v1
kind: Pod
metadata: {name: lp-echo-server}
spec:
  restartPolicy: Never
  containers:
  - name: server
    image: IMAGE
    command: [python3, -c]
    args:
    - |
      import socket
      server = socket.create_server(("0.0.0.0", 7000))
      conn, _ = server.accept()
      conn.sendall(conn.recv(100).upper())
---
apiVersion: v1
kind: Pod
metadata: {name: lp-echo-client}
spec:
  restartPolicy: Never
  hostAliases:
  - {ip: 10.201.0.10, hostnames: [echo-server]}
  volumes:
  - name: source
    hostPath: {path: SOURCE, type: Directory}
  containers:
  - name: client
    image: IMAGE
    env: [{name: PYTHONPATH, value: /opt/launchpad}]
    volumeMounts: [{name: source, mountPath: /opt/launchpad, readOnly: true}]
    command: [python3, -c]
    args:
    - |
      import socket, time
      import launchpad, courier, grpc, numpy, psutil, cloudpickle, portpicker, absl
      for _ in range(200):
          try:
              conn = socket.create_connection(("echo-server", 7000), timeout=5)
              break
          except OSError:
              time.sleep(0.05)
      conn.sendall(b"hello over lpnet")
      print("reply", conn.recv(100).decode(), "from", conn.getpeername()[0])
'''


@pytest.mark.holds('podman')
def test_podman_pods_talk_over_lpnet_and_leave_nothing(tmp_path):
    forwarding = pathlib.Path('/proc/sys/net/ipv4/ip_forward').read_text()
    with testbeds.podman_network() as net:
        pods = tmp_path / 'pods.yaml'
        pods.write_text(ECHO_PODS.replace('IMAGE', net.image).replace('SOURCE', net.source_dir))
        run(['podman', 'kube', 'play', '--network', net.network,
             '--ip', '10.201.0.10', '--ip', '10.201.0.11', str(pods)])
        assert run(['podman', 'wait', 'lp-echo-client-client']).strip() == '0'
        log = run(['podman', 'logs', 'lp-echo-client-client'])
        assert log.strip() == 'reply HELLO OVER LPNET from 10.201.0.10', log
        assert '10.201.0.' not in run(['iptables-save'])  # no NAT, no firewall rules for lpnet
        run(['podman', 'kube', 'play', '--down', str(pods)])
        assert run(['podman', 'pod', 'ps', '-q']).strip() == ''
    assert testbeds.leftovers('podman') == []
    assert pathlib.Path('/proc/sys/net/ipv4/ip_forward').read_text() == forwarding
    assert '10.201.0.' not in run(['iptables-save'])


@pytest.mark.holds('podman')
def test_podman_bed_removes_pods_a_test_left_running(tmp_path):
    with testbeds.podman_network() as net:
        run(['podman', 'run', '-d', '--name', 'lp-left-running', '--network', net.network,
             net.image, 'sleep', '300'])
    assert testbeds.leftovers('podman') == []
    assert run(['podman', 'ps', '-aq', '--filter', 'name=lp-left-running']).strip() == ''


# --- the pytest side -----------------------------------------------------------------------

def test_require_testbed_skips_or_fails_by_environment(monkeypatch):
    monkeypatch.delenv('LAUNCHPAD_TESTBEDS', raising=False)
    with pytest.raises(pytest.skip.Exception, match='no sshd'):
        testbeds.require_testbed('no sshd')
    monkeypatch.setenv('LAUNCHPAD_TESTBEDS', 'required')
    with pytest.raises(pytest.fail.Exception, match='no sshd'):
        testbeds.require_testbed('no sshd')


def test_a_missing_package_skips_with_the_fix(monkeypatch):
    monkeypatch.delenv('LAUNCHPAD_TESTBEDS', raising=False)
    real_which = shutil.which
    monkeypatch.setattr(shutil, 'which', lambda cmd: None if cmd == 'runc' else real_which(cmd))
    with pytest.raises(pytest.skip.Exception, match=r'needs runc; install .*install_packages\.sh'):
        with testbeds.podman_network():
            pass


@pytest.mark.holds('podman')
def test_a_bed_cannot_be_brought_up_twice_in_one_process():
    with testbeds.podman_network():
        with pytest.raises(testbeds.TestbedError, match='already up in this process'):
            with testbeds.podman_network():
                pass


def test_session_fixtures(ssh_testbed, slurm_single):
    assert [ssh_report(host)[0] for host in ssh_testbed] == ['lp-h1', 'lp-h2', 'lp-h3']
    assert srun_hostnames('hostname') == list(slurm_single.nodes)


def test_podman_session_fixture(podman_testbed):
    """Apart from the other beds': the podman bed's tests have a pytest-xdist worker of their own
    (tests/worker_groups.py)."""
    assert run(['podman', 'run', '--rm', '--network', 'none', podman_testbed.image,
                'python3', '-c', 'print(6 * 7)']).strip() == '42'


def test_slurm_fixture_switches_mode_while_ssh_bed_is_up(ssh_testbed, slurm_multi):
    assert sorted(srun_hostnames('-N3', 'hostname')) == list(slurm_multi.nodes)
    assert ssh_report(ssh_testbed[2]) == ['lp-h3', '10.200.0.4']
