"""SIGKILL a checkpointing run at random moments; resuming must give the uninterrupted result bitwise."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _timeouts import scaled

import shardvi as sv

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_fault_worker.py")
# Each trial kills its run 2 to 4 times, then resumes to the end; trials continue until at least MIN_KILLS
# kills have landed (MIN_TRIALS to MAX_TRIALS trials). Every process start costs seconds (import, tracing,
# loading the cached executables), so the kills, not the trials, are what the test counts.
MIN_TRIALS = 2
MAX_TRIALS = 10
MIN_KILLS = 6
N_ITER = 8  # as in _fault_worker.py


def start(ckpt, out, cache):
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    env["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")  # tests/conftest.py's LLVM level for the eager ops
    return subprocess.Popen(
        [sys.executable, WORKER, ckpt, out, cache], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def finish(proc, timeout=300):
    _, err = proc.communicate(timeout=scaled(timeout))
    assert proc.returncode == 0, err.decode()[-3000:]


def load(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def latest_nit(ckpt):
    """The iteration number ``latest.json`` names, ``None`` while it does not exist (or is mid-replace)."""
    try:
        with open(os.path.join(ckpt, "latest.json")) as f:
            return json.load(f)["nit"]
    except (OSError, ValueError, KeyError):
        return None


def check_dir_consistent(ckpt):
    """Every state the directory offers is complete and readable (no partial checkpoint)."""
    if not os.path.exists(os.path.join(ckpt, "latest.json")):
        return None
    import jax.numpy as jnp

    like = {"f": jnp.zeros(16), "g": jnp.zeros(())}
    samples, state = sv.load_checkpoint(ckpt, like)  # raises on any partial/corrupt file
    assert len(samples) == 4
    return state.nit


@pytest.mark.slow
def test_sigkill_resume_bitwise(tmp_path):
    cache = str(tmp_path / "jax_cache")
    ref_out = str(tmp_path / "ref.npz")
    t0 = time.perf_counter()
    p = start("-", ref_out, cache)
    finish(p)
    ref_time = time.perf_counter() - t0
    ref = load(ref_out)
    # a second, cached start tells how long the process runs once compiled
    t0 = time.perf_counter()
    finish(start("-", str(tmp_path / "ref2.npz"), cache))
    run_time = time.perf_counter() - t0
    for k, v in load(str(tmp_path / "ref2.npz")).items():
        np.testing.assert_array_equal(v, ref[k])

    rnd = random.Random(1234)
    kills = 0
    seen_nits = []
    trial = 0
    while trial < MAX_TRIALS and (trial < MIN_TRIALS or kills < MIN_KILLS):
        ckpt = str(tmp_path / f"ck{trial}")
        out = str(tmp_path / f"out{trial}.npz")
        # kill between 2 and 4 times, each at a randomly chosen stage: during start-up / the first iteration
        # (before a checkpoint exists) or a random moment after checkpoint `target` was written
        for _ in range(rnd.randint(2, 4)):
            current = latest_nit(ckpt) or 0
            if current >= N_ITER - 1:
                break
            target = rnd.randint(current, N_ITER - 1)
            proc = start(ckpt, out, cache)
            if target == current:
                time.sleep(rnd.uniform(0.05, run_time / 2))
            else:
                deadline = time.monotonic() + scaled(300)
                while proc.poll() is None and (latest_nit(ckpt) or 0) < target and time.monotonic() < deadline:
                    time.sleep(0.002)
                time.sleep(rnd.uniform(0.0, 0.05))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=scaled(30))
                kills += 1
            seen_nits.append(check_dir_consistent(ckpt))
        finish(start(ckpt, out, cache))
        got = load(out)
        assert got.keys() == ref.keys()
        for k in ref:
            np.testing.assert_array_equal(got[k], ref[k], err_msg=f"trial {trial}, array {k}")
        # temporaries of killed writers are cleaned by the next successful save
        assert not [f for f in os.listdir(ckpt) if f.startswith(".tmp-")]
        trial += 1
    assert kills >= MIN_KILLS, (
        f"only {kills} kills landed in {trial} trials (reference run {ref_time:.1f}s, cached {run_time:.1f}s)"
    )
    # the kills hit different stages: before any checkpoint and between iterations
    assert len(set(seen_nits)) >= 3, seen_nits
