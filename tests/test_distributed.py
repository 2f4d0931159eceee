"""Multi-process runs: two processes on 127.0.0.1 (2 CPU devices each) give bitwise the one-process result."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from _parallel_problem import final_arrays, reference_steps
from _timeouts import scaled

import shardvi as sv

pytestmark = pytest.mark.product_compiler  # bitwise: two processes against one (tests/conftest.py)

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 180  # seconds for both processes together on an idle machine (scaled with the load)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_processes(strategy, out):
    port = _free_port()
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE, os.environ.get("PYTHONPATH", "")]),
    )
    # XLA_FLAGS as this process's (tests/conftest.py's LLVM level): the problem's data come from eager ops, which
    # must round as they do here for the results to be bitwise those of the in-process reference
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_distributed_worker.py"), str(port), str(i), out, strategy],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    limit = scaled(TIMEOUT)
    try:
        for p in procs:
            logs.append(p.communicate(timeout=limit)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"two-process run did not finish within {limit:.0f} s")
    for i, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"process {i} failed:\n{log[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["shard_map"])
def test_two_processes_bitwise_equal_to_one_process(tmp_path, strategy):
    out = str(tmp_path / "result.npz")
    _run_two_processes(strategy, out)
    got = np.load(out)
    steps, _ = reference_steps()
    ref = final_arrays(*steps[-1])
    assert len(got.files) == len(ref)
    for i, b in enumerate(ref):
        a = got[f"arr_{i}"]
        assert a.shape == b.shape and np.array_equal(a, b), f"array {i} differs"
    # model parallelism over the two processes (2 sample shards x 2 model shards, the model axis across
    # the processes): bitwise the one-device run
    from _model_parallel_problem import one_device_run

    ref_arrays, ref_kl, _ = one_device_run("masked")
    got = np.load(out.replace(".npz", "_model.npz"))
    assert list(got["kl"]) == ref_kl
    for i, b in enumerate(ref_arrays):
        assert np.array_equal(got[f"arr_{i}"], np.asarray(b)), f"model-parallel array {i} differs"
    # field parallelism over the two processes, data and start built per process (sv.parallel.field_array):
    # bitwise the one-device run of the same problem
    from test_field_split import one_device

    ref_arrays, ref_kl = one_device("grid")
    got = np.load(out.replace(".npz", "_field.npz"))
    assert list(got["kl"]) == [ref_kl]
    for i, b in enumerate(ref_arrays):
        assert np.array_equal(got[f"arr_{i}"], np.asarray(b)), f"field-parallel array {i} differs"


def _start_kill_resume(root, phase, out):
    port = _free_port()
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE, os.environ.get("PYTHONPATH", "")]),
    )
    worker = os.path.join(HERE, "_kill_resume_worker.py")
    return [
        subprocess.Popen(
            [sys.executable, worker, str(port), str(i), root, phase, out],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]


@pytest.mark.slow
def test_a_lost_process_ends_the_run_and_both_resume_to_the_straight_result(tmp_path):
    """Process 1 dies (SIGKILL) after iteration 2 of 3; process 0, waiting in iteration 3's collectives, is
    ended by JAX's runtime once the heartbeat (5 s) is missed. Both processes restarted with resume=True continue
    from their checkpoints of iteration 2 and end with the bits of the uninterrupted run (the one-process run,
    which the two-process run equals: test_two_processes_bitwise_equal_to_one_process)."""
    import json

    root, out = str(tmp_path), str(tmp_path / "result.npz")

    started = []

    def wait(procs, seconds):
        try:
            return [p.communicate(timeout=scaled(seconds))[0] for p in procs]
        except subprocess.TimeoutExpired:
            for p in started:
                p.kill()
            pytest.fail(f"the two-process run did not end within {scaled(seconds):.0f} s")

    p0, p1 = _start_kill_resume(root, "kill", out)
    started += [p0, p1]
    (log1,) = wait([p1], TIMEOUT)
    assert p1.returncode == -9, log1[-3000:]
    (log0,) = wait([p0], 60)  # the runtime ends the survivor after the missed heartbeat
    assert p0.returncode != 0, log0[-3000:]
    for i in (0, 1):
        with open(os.path.join(root, f"process-{i}", "latest.json")) as f:
            assert json.load(f)["nit"] == 2
    procs = _start_kill_resume(root, "resume", out)
    started += procs
    for i, (p, log) in enumerate(zip(procs, wait(procs, TIMEOUT))):
        assert p.returncode == 0, f"process {i} failed on resume:\n{log[-3000:]}"
    got = np.load(out)
    steps, _ = reference_steps()
    ref = final_arrays(*steps[-1])
    assert len(got.files) == len(ref)
    for i, b in enumerate(ref):
        assert np.array_equal(got[f"arr_{i}"], b), f"array {i} differs"


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(coordinator_address="localhost", num_processes=2, process_id=0), ValueError, "host:port"),
        (dict(coordinator_address="127.0.0.1:1234", num_processes=0, process_id=0), ValueError, "num_processes"),
        (dict(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=2), ValueError, "process_id"),
        (
            dict(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=0, local_device_count=0),
            ValueError,
            "local_device_count",
        ),
        (
            dict(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=0, bind_address=5),
            ValueError,
            "bind_address",
        ),
    ],
)
def test_initialize_distributed_rejects_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        sv.parallel.initialize_distributed(**kwargs)


@pytest.mark.parametrize("process_id", [0, 1], ids=["coordinator-alone", "no-coordinator"])
def test_a_process_that_never_joins_is_a_python_timeout(process_id):
    """Process 0 with no peer, or a peer with no process 0: ``DistributedTimeoutError`` (a ``TimeoutError``)
    after ``initialization_timeout``, before JAX's own initialization (which would end the process)."""
    import time

    address = f"127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(sv.parallel.DistributedTimeoutError) as info:
        sv.parallel.initialize_distributed(address, num_processes=2, process_id=process_id, initialization_timeout=2)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, sv.ShardviError)
    assert 2 <= time.monotonic() - t0 < 2 + scaled(10)
    want = "missing process ids: [1]" if process_id == 0 else "the coordinator (process 0)"
    assert want in str(info.value) and address in str(info.value)
    assert not sv.parallel.is_distributed()


def test_initialize_distributed_after_jax_use_is_a_clear_error():
    jax.devices()  # this test process has long been initialized
    with pytest.raises(RuntimeError, match="before any JAX computation"):
        sv.parallel.initialize_distributed("127.0.0.1:1234", num_processes=2, process_id=0, local_device_count=2)
    assert not sv.parallel.is_distributed()
