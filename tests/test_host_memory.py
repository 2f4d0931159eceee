"""``shardvi.host_memory``: freed buffers of a few MiB go back to the system (glibc), in fresh processes; an opt-in.

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
from _timeouts import scaled

from shardvi import host_memory

SCRIPT = r"""
import json, os, sys
import numpy as np
from shardvi import host_memory as hm
tune = sys.argv[1] == "tune"

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

tuned = hm.keep_host_memory_low() if tune else False
start = rss_mib()
big = np.ones(2 << 20)  # 16 MiB, mapped on its own; freed, it raises glibc's dynamic threshold
del big
arrays = [np.ones(1 << 20) for _ in range(32)]  # 8 MiB each
held = rss_mib() - start
last = arrays[-1]
del arrays
if tune:
    hm.release_host_memory()
print(json.dumps(dict(tuned=tuned, held=held, left=rss_mib() - start)))
"""

GLIBC = host_memory._glibc() is not None and sys.platform.startswith("linux")

HEAPS_SCRIPT = r"""
import ctypes, sys, threading
from shardvi import host_memory as hm

capped = hm.cap_heaps() if sys.argv[1] == "tune" else False
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
held, ready = [], threading.Barrier(8)

def work():
    ready.wait()  # all 8 threads alive at once: each would get a heap of its own
    held.append(libc.malloc(4096))

threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.malloc_stats()  # one "Arena i:" section per heap, on stderr
print(capped)
"""


def run(keep: bool) -> dict:
    mode = "keep" if keep else "tune"
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=scaled(120))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt / malloc_trim only")
def test_threads_share_at_most_max_heaps():
    """glibc gives each new thread a heap of its own (up to 8 per core); capped, 8 threads share 2."""

    def heaps(keep: bool) -> tuple[int, str]:
        env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
        mode = "keep" if keep else "tune"
        out = subprocess.run(
            [sys.executable, "-c", HEAPS_SCRIPT, mode], env=env, capture_output=True, text=True, timeout=scaled(120)
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stderr.count("Arena "), out.stdout.strip().splitlines()[-1]

    (default, set_default), (capped, set_capped) = heaps(keep=True), heaps(keep=False)
    assert set_default == "False" and set_capped == "True"
    assert capped <= host_memory.MAX_HEAPS, capped
    assert default > host_memory.MAX_HEAPS + 1, default  # the main heap and one per thread


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


def test_the_engine_leaves_the_allocator_alone_by_default(monkeypatch):
    """Without ``trim_host_memory`` the engine calls none of the allocator functions (process-wide effects)."""
    import importlib

    import jax
    from _small_problem import exp_problem

    import shardvi as sv

    okl = importlib.import_module("shardvi.vi.engine")
    calls = []
    monkeypatch.setattr(okl, "release_host_memory", lambda: calls.append("trim"))
    monkeypatch.setattr(okl, "keep_host_memory_low", lambda: calls.append("threshold"))
    lh, pos = exp_problem()
    sv.optimize_kl(lh, pos, key=jax.random.PRNGKey(4), n_total_iterations=1, n_samples=1, progress=False)
    assert calls == []


def test_the_engine_trims_after_each_steps_first_call(monkeypatch):
    """With ``trim_host_memory=True``: a step compiled by its call leaves the compiler's freed work memory in the
    heaps: the engine returns it right after that call (while the program runs), besides the trim before each
    stage; later calls add none."""
    import importlib

    import jax
    from _small_problem import exp_problem

    import shardvi as sv
    from shardvi.compilation import CompileCounter

    okl = importlib.import_module("shardvi.vi.engine")
    events = []
    cc = CompileCounter()
    monkeypatch.setattr(okl, "release_host_memory", lambda: events.append(("trim", cc.count)))
    real_stage, real_called = okl.OptimizeVI._stage, okl.OptimizeVI._called

    def stage(self, name, step=None):
        events.append(("stage", name))
        return real_stage(self, name, step)

    def called(self, step):
        events.append(("called", step[0], step not in self._called_steps, cc.count))
        return real_called(self, step)

    monkeypatch.setattr(okl.OptimizeVI, "_stage", stage)
    monkeypatch.setattr(okl.OptimizeVI, "_called", called)
    lh, pos = exp_problem()
    with cc:
        sv.optimize_kl(
            lh,
            pos,
            key=jax.random.PRNGKey(4),
            n_total_iterations=2,
            n_samples=1,
            kl_minimization=sv.NewtonCGConfig(maxiter=2),
            precompile=False,  # every step compiles in its own call
            progress=False,
            trim_host_memory=True,
        )
    firsts = [i for i, e in enumerate(events) if e[0] == "called" and e[2]]
    assert {events[i][1] for i in firsts} == {"draw", "curve", "kl", "diagnostics"}, events
    for i in firsts:
        assert events[i + 1] == ("trim", events[i][3]), events  # right after the call that compiled the step
    assert all(events[i - 1][0] == "stage" for i, e in enumerate(events) if e[0] == "trim" and i - 1 not in firsts)
    trims = sum(e[0] == "trim" for e in events)
    assert trims == len(firsts) + sum(e[0] == "stage" for e in events), events  # repeated calls add none
