"""``shardvi.vi.host_memory``: freed buffers of a few MiB go back to the system (glibc), in fresh processes.

The allocation pattern of an engine step on a device's slab of a field split: a
16 MiB buffer freed (glibc then raises its mmap threshold to 16 MiB), then 32
buffers of 8 MiB, all freed but the last. Left as it is, glibc serves them from
its heap and keeps their pages; with the threshold fixed and the heaps trimmed
they are returned.
"""

import json
import os
import subprocess
import sys

import pytest

from shardvi.vi import host_memory

SCRIPT = r"""
import json, os
import numpy as np
from shardvi.vi import host_memory as hm

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

tuned = hm.keep_host_memory_low()
start = rss_mib()
big = np.ones(2 << 20)  # 16 MiB, mapped on its own; freed, it raises glibc's dynamic threshold
del big
arrays = [np.ones(1 << 20) for _ in range(32)]  # 8 MiB each
held = rss_mib() - start
last = arrays[-1]
del arrays
hm.release_host_memory()
print(json.dumps(dict(tuned=tuned, held=held, left=rss_mib() - start)))
"""

GLIBC = host_memory._glibc() is not None and sys.platform.startswith("linux")


def run(keep: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SHARDVI_KEEP_MALLOC"}
    if keep:
        env["SHARDVI_KEEP_MALLOC"] = "1"
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt / malloc_trim only")
def test_freed_buffers_of_a_few_mib_are_returned():
    kept, tuned = run(keep=True), run(keep=False)
    assert not kept["tuned"] and tuned["tuned"]
    assert kept["held"] > 240 and tuned["held"] > 240  # all 32 buffers were resident (256 MiB)
    assert kept["left"] > 200, kept  # glibc's heap kept the freed ones
    assert tuned["left"] < 40, tuned  # returned: the one still held (8 MiB) and change


def test_release_is_harmless_to_call_again_and_anywhere():
    """Nothing to return, or not glibc: no error, no effect on arrays in use."""
    import numpy as np

    a = np.arange(1 << 18, dtype=np.float64)
    host_memory.release_host_memory()
    host_memory.release_host_memory()
    assert a[12345] == 12345.0 and a.sum() == (1 << 18) * ((1 << 18) - 1) / 2


def test_release_trims_only_after_the_resident_set_grew(monkeypatch):
    """``malloc_trim`` walks every heap (milliseconds per call): it runs again only after the resident set grew by
    ``TRIM_AFTER_GROWTH`` since the last trim, or when forced."""
    trims, rss = [], [400 << 20]

    class FakeLibc:
        def malloc_trim(self, pad):
            trims.append(pad)

    monkeypatch.setattr(host_memory, "_glibc", lambda: FakeLibc())
    monkeypatch.setattr(host_memory, "_resident_bytes", lambda: rss[0])
    monkeypatch.setattr(host_memory, "_after_last_trim", [0])
    monkeypatch.delenv("SHARDVI_KEEP_MALLOC", raising=False)
    host_memory.release_host_memory()  # the first call trims
    assert len(trims) == 1
    rss[0] += host_memory.TRIM_AFTER_GROWTH - 1
    host_memory.release_host_memory()  # grew by less: nothing new to return
    assert len(trims) == 1
    host_memory.release_host_memory(force=True)
    assert len(trims) == 2
    rss[0] += host_memory.TRIM_AFTER_GROWTH
    host_memory.release_host_memory()
    assert trims == [0, 0, 0]
    monkeypatch.setenv("SHARDVI_KEEP_MALLOC", "1")
    rss[0] += 10 * host_memory.TRIM_AFTER_GROWTH
    host_memory.release_host_memory(force=True)  # the opt-out leaves the allocator alone
    assert len(trims) == 3
