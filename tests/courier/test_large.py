"""A 1 GiB numpy array round-trips through courier, using memory for the array alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

GIB = 1 << 30

# Runs in a fresh process, so that its peak memory is measured alone and given
# back to the system afterwards. Client and server share the process, and call over TCP as
# between hosts (COURIER_SAME_HOST=0: no upgrade to the Unix socket and shared memory).
_ROUND_TRIP = '''
import json, resource, time
import numpy as np
import courier

server = courier.Server()
server.Bind('checksum_and_echo', lambda array: (int(array[::4096].sum()), array))
server.Start()
client = courier.Client(server.address, call_timeout=600)
array = np.arange({size} // 8, dtype=np.int64)
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.monotonic()
checksum, echoed = client.checksum_and_echo(array)
seconds = time.monotonic() - start
ok = (echoed.shape == array.shape and echoed.dtype == array.dtype
      and bool(np.array_equal(echoed[::4096], array[::4096]))
      and int(echoed[-1]) == int(array[-1]) and checksum == int(array[::4096].sum())
      and echoed.flags.writeable)
server.Stop()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{'ok': ok, 'seconds': seconds, 'baseline': baseline, 'peak': peak}}))
'''


@pytest.mark.timeout(600)
def test_one_gib_array_round_trip(subprocess_env):
    result = subprocess.run(
        [sys.executable, '-c', _ROUND_TRIP.format(size=GIB)], capture_output=True, text=True,
        timeout=600, check=False, env={**subprocess_env, 'COURIER_SAME_HOST': '0'})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report['ok'], report
    # Streamed in chunks, the array is materialized once on each side: about 2 GiB.
    # More means a copy of the whole payload crept into the path.
    growth = report['peak'] - report['baseline']
    assert growth < 2.75 * GIB, f'1 GiB round trip grew memory by {growth / GIB:.2f} GiB'
