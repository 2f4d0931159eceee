"""Array-only checkpoints: bitwise resume, atomic files, clear errors, no pickle, and no lost data
(only own files pruned, no silent overwrite, one writer at a time, fingerprinted runs, validated indices)."""

import fcntl
import hashlib
import json
import os
import pathlib
import select
import signal
import socket
import stat
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _timeouts import scaled

import shardvi as sv
from shardvi.vi import checkpoint as ckpt
from shardvi.vi.checkpoint import files as ckpt_files
from shardvi.vi.checkpoint import fingerprints as ckpt_fp
from shardvi.vi.checkpoint import lock as ckpt_lock

N = 6


def make_lh(n=N):
    rng = np.random.default_rng(0)
    model = sv.Model(
        lambda x: jnp.exp(0.5 * x["f"]) + x["g"],
        {"f": jax.ShapeDtypeStruct((n,), jnp.float64), "g": jax.ShapeDtypeStruct((), jnp.float64)},
    )
    return sv.Gaussian(np.exp(0.3 * rng.normal(size=n)) + 0.2, noise_std=0.2).amend(model)


KW = dict(
    n_samples=2,
    sample_mode=lambda i: "nonlinear_resample" if i < 2 else "nonlinear_update",
    linear_sampling=sv.CGConfig(tol=1e-8),
    nonlinear_update=sv.NewtonCGConfig(xtol=1e-8, maxiter=5),
    kl_minimization=sv.NewtonCGConfig(xtol=1e-8, maxiter=5),
)


def pos0(n=N):
    return {"f": jnp.zeros(n), "g": jnp.zeros(())}


def leaves(samples):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves((samples.pos, samples.residuals, samples.keys))]


@pytest.mark.slow
def test_resume_is_bitwise_equal(tmp_path):
    lh = make_lh()
    key = jax.random.PRNGKey(9)
    straight, st_straight = sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=4, **KW)
    d = str(tmp_path / "ck")
    sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=2, checkpoint_dir=d, **KW)
    resumed, st_resumed = sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=4, checkpoint_dir=d, resume=True, **KW)
    assert st_resumed.nit == 4 and len(st_resumed.history) == 4
    for a, b in zip(leaves(straight), leaves(resumed)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(st_straight.key), np.asarray(st_resumed.key))
    assert [r.kl_energy for r in st_straight.history] == [r.kl_energy for r in st_resumed.history]


def test_processes_resuming_at_different_iterations_are_refused(tmp_path, monkeypatch):
    """Multi-process: each process resumes its own checkpoint; one an iteration behind the others (killed
    while they wrote) is a CheckpointError on every process before any work (here the other process's
    iteration is what the all-gather returns)."""
    from jax.experimental import multihost_utils

    lh = make_lh()
    d = str(tmp_path / "ck")
    sv.optimize_kl(lh, pos0(), key=jax.random.PRNGKey(9), n_total_iterations=1, checkpoint_dir=d, **KW)
    gathered = []

    def allgather(x):
        gathered.append(int(x))
        return np.stack([np.asarray(x), np.zeros_like(np.asarray(x))])  # process 1 starts at iteration 0

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    with pytest.raises(sv.CheckpointError, match=r"different iterations \[1, 0\]"):
        sv.optimize_kl(lh, pos0(), key=jax.random.PRNGKey(9), n_total_iterations=2, checkpoint_dir=d, resume=True, **KW)
    assert gathered == [1]


@pytest.mark.slow
def test_resume_from_a_path(tmp_path):
    """resume='dir' (NIFTy.re's spelling): into another checkpoint_dir, the source untouched; or in place."""
    lh = make_lh()
    key = jax.random.PRNGKey(9)
    src = str(tmp_path / "run1")
    sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=1, checkpoint_dir=src, **KW)
    before = {f: os.stat(os.path.join(src, f)).st_mtime_ns for f in os.listdir(src)}
    other = tmp_path / "run2"
    cont, st = sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=2, checkpoint_dir=other, resume=src, **KW)
    assert st.nit == 2 and len(st.history) == 2
    assert {f: os.stat(os.path.join(src, f)).st_mtime_ns for f in os.listdir(src)} == before  # only read
    # in place, named by a file of the checkpoint: the same continuation, bitwise
    index = os.path.join(src, "latest.json")
    again, st2 = sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=2, resume=pathlib.Path(index), **KW)
    assert st2.nit == 2
    for a, b in zip(leaves(cont), leaves(again)):
        np.testing.assert_array_equal(a, b)
    assert sv.vi.checkpoint.read_index(src)["nit"] == 2 and sv.vi.checkpoint.read_index(other)["nit"] == 2
    # a target holding another checkpoint is not replaced without overwrite=True
    with pytest.raises(sv.CheckpointError, match="overwrite"):
        sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=3, checkpoint_dir=other, resume=src, **KW)


@pytest.mark.slow
def test_checkpoint_files_and_no_pickle(tmp_path):
    d = str(tmp_path / "ck")
    samples, state = sv.optimize_kl(
        make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=3, checkpoint_dir=d, **KW
    )
    files = sorted(os.listdir(d))
    assert files == ["latest.json", "state-000002.npz", "state-000003.npz"]  # the two newest are kept
    meta = json.load(open(os.path.join(d, "latest.json")))
    assert meta["nit"] == 3 and meta["npz"] == "state-000003.npz" and len(meta["history"]) == 3
    with np.load(os.path.join(d, "state-000003.npz"), allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
        np.testing.assert_array_equal(z["pos_0"], np.asarray(samples.pos["f"]))
    loaded, st = sv.load_checkpoint(d, pos0())
    for a, b in zip(leaves(samples), leaves(loaded)):
        np.testing.assert_array_equal(a, b)
    assert st.nit == 3 and st.history == state.history


@pytest.mark.slow
def test_resume_without_checkpoint_starts_fresh(tmp_path):
    d = str(tmp_path / "empty")
    a, _ = sv.optimize_kl(
        make_lh(), pos0(), key=jax.random.PRNGKey(1), n_total_iterations=1, checkpoint_dir=d, resume=True, **KW
    )
    b, _ = sv.optimize_kl(make_lh(), pos0(), key=jax.random.PRNGKey(1), n_total_iterations=1, **KW)
    for x, y in zip(leaves(a), leaves(b)):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ck"))
    sv.optimize_kl(make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=1, checkpoint_dir=d, **KW)
    return d


def copy_dir(src, dst):
    os.makedirs(dst)
    for f in os.listdir(src):
        with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b:
            b.write(a.read())
    return dst


def test_truncated_arrays_are_rejected(written, tmp_path):
    d = copy_dir(written, str(tmp_path / "c"))
    npz = os.path.join(d, "state-000001.npz")
    data = open(npz, "rb").read()
    open(npz, "wb").write(data[: len(data) // 2])
    with pytest.raises(sv.CheckpointError, match="SHA-256"):
        sv.load_checkpoint(d, pos0())
    with pytest.raises(sv.CheckpointError):
        sv.optimize_kl(
            make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=2, checkpoint_dir=d, resume=True, **KW
        )


def test_corrupted_index_is_rejected(written, tmp_path):
    d = copy_dir(written, str(tmp_path / "c"))
    open(os.path.join(d, "latest.json"), "w").write('{"format": "shardvi-checkpoint-v1", "nit": ')
    with pytest.raises(sv.CheckpointError, match="corrupted"):
        sv.load_checkpoint(d, pos0())


def test_different_model_structure_is_rejected(written):
    with pytest.raises(sv.CheckpointError, match="different model structure"):
        sv.load_checkpoint(written, pos0(n=N + 1))
    with pytest.raises(sv.CheckpointError, match="different model structure"):
        sv.load_checkpoint(written, {"f": jnp.zeros(N)})


def test_pickle_payload_is_never_loaded(written, tmp_path):
    """An npz holding an object array (pickle) is refused, not executed."""
    d = copy_dir(written, str(tmp_path / "c"))
    npz = os.path.join(d, "state-000001.npz")
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["pos_0"] = np.array([object()], dtype=object)
    np.savez(npz, **arrays)
    meta = json.load(open(os.path.join(d, "latest.json")))
    import hashlib

    meta["sha256"] = hashlib.sha256(open(npz, "rb").read()).hexdigest()
    json.dump(meta, open(os.path.join(d, "latest.json"), "w"))
    with pytest.raises(sv.CheckpointError, match="unreadable"):
        sv.load_checkpoint(d, pos0())


# -- helpers for the data-safety tests -----------------------------------------------------------
HERE = os.path.dirname(os.path.abspath(__file__))
LOCK_WORKER = os.path.join(HERE, "_lock_worker.py")


def synthetic(nit, n=N, n_pairs=1):
    """Samples/state of the test model's structure without running anything."""
    pos = {"f": jnp.linspace(0.0, 1.0, n) + nit, "g": jnp.asarray(float(nit))}
    res = jax.tree_util.tree_map(lambda x: jnp.stack([x, -x] * n_pairs), pos)
    keys = jnp.asarray(np.arange(2 * n_pairs, dtype=np.uint32).reshape(n_pairs, 2))
    return sv.Samples(pos, res, keys), sv.OptimizeVIState(nit=nit, key=jnp.asarray([nit, 7], jnp.uint32))


def save_synthetic(d, nits, **kw):
    for nit in nits:
        sv.save_checkpoint(d, *synthetic(nit), **kw)


def index(d):
    with open(os.path.join(d, "latest.json")) as f:
        return json.load(f)


def write_index(d, meta):
    with open(os.path.join(d, "latest.json"), "w") as f:
        json.dump(meta, f)


def rewrite_npz(d, change):
    """Apply ``change(arrays)`` to the newest npz and record its new SHA-256 in the index."""
    meta = index(d)
    npz = os.path.join(d, meta["npz"])
    with np.load(npz) as z:
        arrays = {k: z[k] for k in z.files}
    change(arrays)
    with open(npz, "wb") as f:
        np.savez(f, **arrays)
    meta["sha256"] = hashlib.sha256(open(npz, "rb").read()).hexdigest()
    write_index(d, meta)


def user_files(d):
    return sorted(f for f in os.listdir(d) if f not in ("latest.json",) and not f.startswith("state-00000"))


# -- 1. pruning touches only the run's own files ---------------------------------------------------

USER_FILES = ["state-0-backup.npz", "state-space.npz", "state-zzz.npz", "state-000000.npz", "notes.txt"]


def test_pruning_deletes_only_files_the_run_wrote(tmp_path):
    d = str(tmp_path / "ck")
    os.makedirs(d)
    for f in USER_FILES:  # user files, some sorting before and some after the run's own, one named like ours
        (tmp_path / "ck" / f).write_bytes(b"user data " + f.encode())
    save_synthetic(d, [1, 2, 3, 4, 5])
    for f in USER_FILES:
        assert (tmp_path / "ck" / f).read_bytes() == b"user data " + f.encode()
    own = sorted(f for f in os.listdir(d) if f.startswith("state-00000") and f != "state-000000.npz")
    assert own == ["state-000004.npz", "state-000005.npz"]
    assert index(d)["files"] == ["state-000004.npz", "state-000005.npz"]
    samples, state = sv.load_checkpoint(d, pos0())
    assert state.nit == 5
    np.testing.assert_array_equal(np.asarray(samples.pos["f"]), np.linspace(0.0, 1.0, N) + 5)


def test_pruning_continues_across_save_calls_and_runs(tmp_path):
    """The list of own files is inherited from the index: a resumed run prunes its predecessor's files."""
    d = str(tmp_path / "ck")
    save_synthetic(d, [1, 2])
    save_synthetic(d, [3])  # a later call (e.g. a resumed run) continues the list
    assert sorted(f for f in os.listdir(d) if f.endswith(".npz")) == ["state-000002.npz", "state-000003.npz"]


# -- 2. a fresh run refuses to replace a checkpoint unless overwrite=True ----------------------------


def test_fresh_run_into_a_checkpoint_is_refused(written, tmp_path):
    d = copy_dir(written, str(tmp_path / "c"))
    before = {f: open(os.path.join(d, f), "rb").read() for f in os.listdir(d)}
    with pytest.raises(
        sv.CheckpointError,
        match=r"checkpoint_dir .* already holds a checkpoint of iteration 1.*"
        r"resume=True.*overwrite=True",
    ):
        sv.optimize_kl(make_lh(), pos0(), key=jax.random.PRNGKey(3), n_total_iterations=2, checkpoint_dir=d, **KW)
    assert {f: open(os.path.join(d, f), "rb").read() for f in os.listdir(d)} == before  # untouched, lock released


@pytest.mark.slow
def test_overwrite_replaces_only_the_old_runs_files(tmp_path):
    d = str(tmp_path / "ck")
    save_synthetic(d, [5, 6])  # an old run's checkpoints (its index lists both)
    (tmp_path / "ck" / "state-0-backup.npz").write_bytes(b"mine")
    samples, state = sv.optimize_kl(
        make_lh(), pos0(), key=jax.random.PRNGKey(3), n_total_iterations=2, checkpoint_dir=d, overwrite=True, **KW
    )
    assert sorted(os.listdir(d)) == ["latest.json", "state-0-backup.npz", "state-000001.npz", "state-000002.npz"]
    assert (tmp_path / "ck" / "state-0-backup.npz").read_bytes() == b"mine"
    meta = index(d)
    assert meta["nit"] == 2 and meta["files"] == ["state-000001.npz", "state-000002.npz"]
    loaded, st = sv.load_checkpoint(d, pos0())
    for a, b in zip(leaves(samples), leaves(loaded)):
        np.testing.assert_array_equal(a, b)
    # the new run resumes (it is its own checkpoint now)
    _, st2 = sv.optimize_kl(
        make_lh(), pos0(), key=jax.random.PRNGKey(3), n_total_iterations=2, checkpoint_dir=d, resume=True, **KW
    )
    assert st2.nit == 2 and st2.history == state.history


RESUME_ARGS = [
    ("resume path without checkpoint", dict(resume="no-such-dir"), ValueError, "holds no checkpoint"),
    ("resume int", dict(resume=1), TypeError, "resume must be False, True, 'force' or the path"),
    ("overwrite type", dict(overwrite="yes"), TypeError, "overwrite must be a bool"),
    ("resume and overwrite", dict(resume=True, overwrite=True), ValueError, "resume and overwrite"),
    (
        "overwrite without dir",
        dict(overwrite=True, checkpoint_dir=None),
        ValueError,
        "overwrite=True needs checkpoint_dir",
    ),
    ("force without dir", dict(resume="force", checkpoint_dir=None), ValueError, "needs checkpoint_dir"),
]


@pytest.mark.parametrize("case", RESUME_ARGS, ids=[c[0] for c in RESUME_ARGS])
def test_resume_and_overwrite_arguments(case, tmp_path):
    _, kw, exc, msg = case
    args = dict(checkpoint_dir=str(tmp_path / "ck"))
    args.update(kw)
    with pytest.raises(exc, match=msg):
        sv.optimize_kl(make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=1, **args, **KW)
    assert not os.path.exists(tmp_path / "ck")  # rejected before anything is created


# -- 3. one writer at a time -------------------------------------------------------------------------


def start_holder(d):
    """A real second process holding ``d``'s lock; returns (process, pid)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_")}
    p = subprocess.Popen(
        [sys.executable, LOCK_WORKER, d], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    ready, _, _ = select.select([p.stdout], [], [], scaled(120))
    line = p.stdout.readline().decode() if ready else ""
    if not line.startswith("locked"):
        p.kill()
        _, err = p.communicate(timeout=scaled(30))
        pytest.fail(f"lock worker did not start: {line!r} {err.decode()[-2000:]}")
    return p, int(line.split()[1])


def stop_holder(p):
    p.stdin.close()
    p.wait(timeout=scaled(60))
    p.stdout.close()
    p.stderr.close()


def test_second_process_is_refused_and_named(tmp_path):
    d = str(tmp_path / "ck")
    os.makedirs(d)
    p, pid = start_holder(d)
    try:
        info = json.load(open(os.path.join(d, ckpt.LOCK_NAME)))
        assert info["pid"] == pid and info["host"] == socket.gethostname() and "started" in info
        holder = rf"in use by another run: .* held by pid {pid} on host '{socket.gethostname()}'"
        with pytest.raises(sv.CheckpointError, match=holder):
            sv.optimize_kl(make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=1, checkpoint_dir=d, **KW)
        with pytest.raises(sv.CheckpointError, match=holder):
            sv.save_checkpoint(d, *synthetic(1))
        assert not os.path.exists(os.path.join(d, "latest.json"))
    finally:
        stop_holder(p)
    assert p.returncode == 0 and not os.path.exists(os.path.join(d, ckpt.LOCK_NAME))  # released on exit
    sv.save_checkpoint(d, *synthetic(1))  # now free
    assert sorted(os.listdir(d)) == ["latest.json", "state-000001.npz"]


def test_stale_lock_of_a_dead_process_is_reported_and_taken_over(tmp_path):
    d = str(tmp_path / "ck")
    os.makedirs(d)
    p, pid = start_holder(d)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=scaled(60))
    p.stdin.close(), p.stdout.close(), p.stderr.close()
    assert json.load(open(os.path.join(d, ckpt.LOCK_NAME)))["pid"] == pid  # left behind
    with pytest.warns(RuntimeWarning, match=rf"took over the stale lock .* pid {pid} .* no longer runs"):
        with ckpt.checkpoint_lock(d):
            assert json.load(open(os.path.join(d, ckpt.LOCK_NAME)))["pid"] == os.getpid()
    assert not os.path.exists(os.path.join(d, ckpt.LOCK_NAME))


def fake_lock(d, **info):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, ckpt.LOCK_NAME), "w") as f:
        json.dump({"started": "2024-01-01T00:00:00+00:00", **info}, f)


def test_lock_of_another_host_or_live_pid_is_reported(tmp_path, monkeypatch):
    d = str(tmp_path / "ck")
    fake_lock(d, pid=4242, host="some-other-host")
    with pytest.raises(sv.CheckpointError, match=r"pid 4242 on host 'some-other-host'.*cannot check.*delete"):
        sv.save_checkpoint(d, *synthetic(1))
    # same host, a live pid that holds no flock (another tool, or a filesystem without flock): not taken over
    fake_lock(d, pid=os.getppid(), host=socket.gethostname())
    with pytest.raises(sv.CheckpointError, match=rf"pid {os.getppid()} .*If pid {os.getppid()} is not a shardvi"):
        sv.save_checkpoint(d, *synthetic(1))
    # no readable owner record after a short grace period (a lock being created): flock-ed -> in use
    monkeypatch.setattr(ckpt_lock, "_LOCK_WAIT", 0.05)
    with open(os.path.join(d, ckpt.LOCK_NAME), "w") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        with pytest.raises(sv.CheckpointError, match="no readable owner record and is in use by a running process"):
            sv.save_checkpoint(d, *synthetic(1))
    assert not os.path.exists(os.path.join(d, "latest.json"))
    # ... not flock-ed: its creator died between creating and writing it -> taken over
    with pytest.warns(RuntimeWarning, match="took over the stale lock .* died while creating it"):
        sv.save_checkpoint(d, *synthetic(1))
    assert sorted(os.listdir(d)) == ["latest.json", "state-000001.npz"]


def test_lock_is_reentrant_and_released_on_error(tmp_path):
    d = str(tmp_path / "ck")
    os.makedirs(d)
    with pytest.raises(RuntimeError, match="boom"):
        with ckpt.checkpoint_lock(d):
            sv.save_checkpoint(d, *synthetic(1))  # re-entrant: the run's own lock
            assert os.path.exists(os.path.join(d, ckpt.LOCK_NAME))
            raise RuntimeError("boom")
    assert not os.path.exists(os.path.join(d, ckpt.LOCK_NAME))


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=scaled(60))
    return p.pid


def test_only_dead_writers_temporaries_of_this_host_are_removed(tmp_path):
    d = str(tmp_path / "ck")
    os.makedirs(d)
    tag, other = ckpt_files._host_tag(), ckpt_files._host_tag("some-other-host")
    dead, live = dead_pid(), os.getppid()
    names = {
        f".tmp-{dead}-{tag}-abc-state-000001.npz": False,  # a killed writer of this host: removed
        f".tmp-{live}-{tag}-abc-state-000001.npz": True,  # a live writer: never touched
        f".tmp-{dead}-{other}-abc-latest.json": True,  # another host: cannot tell, kept
        ".tmp-abc-latest.json": True,
    }  # not ours (no pid): kept
    for f in names:
        (tmp_path / "ck" / f).write_bytes(b"x")
    sv.save_checkpoint(d, *synthetic(1))
    for f, kept in names.items():
        assert os.path.exists(os.path.join(d, f)) == kept, f
    assert not [f for f in os.listdir(d) if f.startswith(f".tmp-{os.getpid()}-")]  # ours are renamed away


# -- 4. fingerprint: resuming a different run is refused, saying what differs ---------------------------


def other_model_lh(data_shift=0.0, noise=0.2, kind="gaussian", n=N):
    rng = np.random.default_rng(0)
    model = sv.Model(
        lambda x: jnp.exp(0.5 * x["f"]) + x["g"],
        {"f": jax.ShapeDtypeStruct((n,), jnp.float64), "g": jax.ShapeDtypeStruct((), jnp.float64)},
    )
    data = np.exp(0.3 * rng.normal(size=n)) + 0.2 + data_shift
    if kind == "studentt":
        return sv.StudentT(data, dof=3.0, noise_std=noise).amend(model)
    return sv.Gaussian(data, noise_std=noise).amend(model)


MISMATCHES = [
    # (id, likelihood, optimize_kl overrides, message regex)
    ("data", other_model_lh(data_shift=0.1), {}, r"data \['likelihood'\]\['Gaussian'\]\['data'\]: the values differ"),
    ("noise", other_model_lh(noise=0.3), {}, r"\['Gaussian'\]\['noise_std'\]: the values differ"),
    ("likelihood kind", other_model_lh(kind="studentt"), {}, r"likelihood: a different kind.*StudentT"),
    ("n_samples", make_lh(), dict(n_samples=3), r"n_samples at iteration 0: 2 in the checkpoint, 3 now"),
    (
        "sample_mode",
        make_lh(),
        dict(sample_mode="linear_resample"),
        r"sample_mode at iteration 0: 'nonlinear_resample' in the checkpoint, 'linear_resample' now",
    ),
    ("mirror_samples", make_lh(), dict(mirror_samples=False), r"mirror_samples: True in the checkpoint, False now"),
    (
        "point_estimates",
        make_lh(),
        dict(point_estimates=("g",)),
        r"point_estimates: \[\] in the checkpoint, \[\"\['g'\]\"\] now",
    ),
    ("constants", make_lh(), dict(constants=("f",)), r"constants: \[\] in the checkpoint, \[\"\['f'\]\"\] now"),
]


@pytest.mark.parametrize("case", MISMATCHES, ids=[c[0] for c in MISMATCHES])
def test_resume_of_a_different_run_is_refused(case, written):
    _, lh, over, msg = case
    kw = {**KW, **over}
    with pytest.raises(
        sv.CheckpointError,
        match=r"belongs to a different run:(.|\n)*" + msg + r"(.|\n)*"
        r"resume='force'",
    ):
        sv.optimize_kl(
            lh, pos0(), key=jax.random.PRNGKey(0), n_total_iterations=2, checkpoint_dir=written, resume=True, **kw
        )
    assert not os.path.exists(os.path.join(written, ckpt.LOCK_NAME))


def test_resume_with_another_latent_structure_is_refused(written):
    lh = make_lh(n=N + 1)
    with pytest.raises(sv.CheckpointError, match="different model structure.*cannot be forced"):
        sv.optimize_kl(
            lh,
            pos0(N + 1),
            key=jax.random.PRNGKey(0),
            n_total_iterations=2,
            checkpoint_dir=written,
            resume="force",
            **KW,
        )


def test_resume_force_continues_with_a_warning(written):
    ref, st_ref = sv.load_checkpoint(written, pos0())
    with pytest.warns(RuntimeWarning, match=r"different run \(forced\)(.|\n)*values differ"):
        # n_total_iterations == the checkpoint's: returns it without computing
        got, st = sv.optimize_kl(
            other_model_lh(data_shift=0.1),
            pos0(),
            key=jax.random.PRNGKey(0),
            n_total_iterations=1,
            checkpoint_dir=written,
            resume="force",
            **KW,
        )
    assert st.nit == 1 and st.history == st_ref.history
    for a, b in zip(leaves(ref), leaves(got)):
        np.testing.assert_array_equal(a, b)


def test_fingerprint_follows_data_through_amend_and_sum():
    model = sv.Model(lambda x: x, jax.ShapeDtypeStruct((3,), jnp.float64))
    a = sv.Gaussian(np.arange(3.0), noise_std=1.0)
    b = sv.Poisson(np.arange(3.0))
    fp = ckpt.fingerprint((a + b).amend(model), jnp.zeros(3))["likelihood"]
    assert [r[0] for r in fp["leaves"]] == [
        "['likelihood'][0]['Gaussian']['data']",
        "['likelihood'][0]['Gaussian']['noise_std']",
        "['likelihood'][1]['Poisson']['counts']",
        "['model_output']",
    ]
    assert fp["unknown"] == [] and fp["leaves"][3][3] is None  # shapes only for the model output
    assert fp["leaves"][0][3] == ckpt_fp._leaf_record("", np.arange(3.0))[3]  # SHA-256 of the data bytes
    changed = ckpt.fingerprint((a + sv.Poisson(np.arange(3.0) + 1)).amend(model), jnp.zeros(3))
    assert ckpt_fp._fingerprint_differences({"likelihood": fp}, changed) == [
        f"data ['likelihood'][1]['Poisson']['counts']: the values differ (SHA-256 {fp['leaves'][2][3][:12]}... "
        f"in the checkpoint, {changed['likelihood']['leaves'][2][3][:12]}... now)"
    ]
    # what is not known is listed, not guessed: a callable noise covariance, a user-built likelihood
    c = sv.Gaussian(np.arange(3.0), noise_cov_inv=lambda r: r, noise_std_inv=lambda r: r)
    assert ckpt.fingerprint(c, jnp.zeros(3))["likelihood"]["unknown"] == ["['Gaussian']['noise_cov_inv']"]
    user = sv.Likelihood(lambda s: jnp.sum(s**2), domain=jax.ShapeDtypeStruct((3,), jnp.float64))
    assert ckpt.fingerprint(user, jnp.zeros(3))["likelihood"] == {"leaves": [], "unknown": ["<all>"]}
    user = sv.Likelihood(
        lambda s: jnp.sum(s**2), domain=jax.ShapeDtypeStruct((3,), jnp.float64), data_leaves={"data": np.arange(3.0)}
    )
    assert ckpt.fingerprint(user, jnp.zeros(3))["likelihood"]["unknown"] == []


# -- 5. the whole index and every array are validated before anything runs ----------------------------


def _set(key, value):
    def f(meta):
        meta[key] = value

    return f


def _drop(key):
    def f(meta):
        del meta[key]

    return f


def _hist(key, value):
    def f(meta):
        meta["history"][0][key] = value

    return f


INDEX_CASES = [
    # (id, change of the parsed index, message regex)
    ("no format", lambda m: m.clear() or m.update({"x": []}), "format is None"),
    ("missing nit", _drop("nit"), r"missing field\(s\) \['nit'\]"),
    ("missing history", _drop("history"), r"missing field\(s\) \['history'\]"),
    ("missing files", _drop("files"), r"missing field\(s\) \['files'\]"),
    ("wrong format", _set("format", "shardvi-checkpoint-v9"), "format is 'shardvi-checkpoint-v9'"),
    ("nit string", _set("nit", "1"), "nit must be an int"),
    ("nit bool", _set("nit", True), "nit must be an int"),
    ("nit negative", _set("nit", -1), "nit must be an int >= 0"),
    ("npz relative path", _set("npz", "../other/state-000001.npz"), "npz must be a bare file name"),
    ("npz absolute path", _set("npz", "/tmp/state-000001.npz"), "npz must be a bare file name"),
    ("npz other name", _set("npz", "state-1.npz"), "npz must be a bare file name"),
    ("npz not a string", _set("npz", 1), "npz must be a bare file name"),
    ("npz of another iteration", _set("npz", "state-000002.npz"), "does not belong to iteration nit=1"),
    ("sha256 short", _set("sha256", "abc"), "sha256 must be 64"),
    ("sha256 missing", _drop("sha256"), r"missing field\(s\) \['sha256'\]"),
    ("structure list", _set("structure", []), "structure must be"),
    ("structure leaf", lambda m: m["structure"]["leaves"].__setitem__(0, ["['f']", [6], 3]), "structure must be"),
    ("n_residuals string", _set("n_residuals", "4"), "n_residuals must be an int"),
    ("history dict", _set("history", {}), "history must be a list"),
    ("history entry not object", _set("history", [3]), r"history\[0\] must be an object"),
    ("history missing field", lambda m: m["history"][0].pop("kl_energy"), r"missing field\(s\) \['kl_energy'\]"),
    (
        "history status not ints",
        lambda m: m["history"][0].update(sampling_status=["converged"]),
        r"history\[0\]\.sampling_status must be a list of ints or null",
    ),
    ("history unknown field", _hist("evil", 1), r"unknown field\(s\) \['evil'\]"),
    ("history kl_energy string", _hist("kl_energy", "low"), r"history\[0\].kl_energy must be a number"),
    ("history sample_mode", _hist("sample_mode", "fancy"), r"sample_mode must be one of the sample modes"),
    ("history nit list", _hist("sampling_nit", [1, "2"]), r"sampling_nit must be a list of ints"),
    ("history iteration", _hist("iteration", 5), "out of order"),
    ("files not a list", _set("files", "state-000001.npz"), "files must be a list"),
    ("files with a path", _set("files", ["../state-000001.npz", "state-000001.npz"]), "files must be a list"),
    ("files without npz", _set("files", ["state-000000.npz"]), "must be distinct and include npz"),
    ("fingerprint list", _set("fingerprint", []), "fingerprint must be"),
    ("fingerprint leaf", lambda m: m["fingerprint"]["likelihood"]["leaves"].__setitem__(0, "x"), "fingerprint must be"),
]


@pytest.mark.parametrize("case", INDEX_CASES, ids=[c[0] for c in INDEX_CASES])
def test_corrupted_index_is_a_checkpoint_error(case, written, tmp_path):
    _, change, msg = case
    d = copy_dir(written, str(tmp_path / "c"))
    meta = index(d)
    change(meta)
    write_index(d, meta)
    with pytest.raises(sv.CheckpointError, match=msg):
        sv.load_checkpoint(d, pos0())


RAW_INDEX_CASES = [
    ("not utf-8", b"\xff\xfe{", "corrupted"),
    ("truncated", b'{"format": "shardvi-checkpoint-v2", "nit": ', "corrupted"),
    ("deeply nested", b"[" * 100000 + b"]" * 100000, "corrupted"),
    ("a list", b"[1, 2]", "expected a JSON object"),
]


@pytest.mark.parametrize("case", RAW_INDEX_CASES, ids=[c[0] for c in RAW_INDEX_CASES])
def test_unparsable_index_is_a_checkpoint_error(case, written, tmp_path):
    _, raw, msg = case
    d = copy_dir(written, str(tmp_path / "c"))
    open(os.path.join(d, "latest.json"), "wb").write(raw)
    with pytest.raises(sv.CheckpointError, match=msg):
        sv.load_checkpoint(d, pos0())


def _arr(name, value):
    def f(arrays):
        arrays[name] = value(arrays[name]) if callable(value) else value

    return f


ARRAY_CASES = [
    # (id, change of the npz's arrays, message regex)
    (
        "pos shape",
        _arr("pos_0", np.zeros(N + 1)),
        r"pos_0 \(latent \['f'\]\) has shape \(7,\) float64, expected \(6,\)",
    ),
    ("pos dtype", _arr("pos_0", lambda a: a.astype(np.float32)), r"pos_0 .* float32, expected \(6,\) float64"),
    ("residuals without sample axis", _arr("residuals_1", np.zeros(())), r"residuals_1 .* expected \(4,\)"),
    ("residuals count", _arr("residuals_0", np.zeros((3, N))), r"residuals_0 .* expected \(4, 6\)"),
    ("keys dtype", _arr("keys", lambda a: a.astype(np.int64)), r"keys must have shape \(n_keys, 2\) uint32"),
    ("keys shape", _arr("keys", np.zeros((2, 3), np.uint32)), r"keys must have shape \(n_keys, 2\) uint32"),
    ("keys count", _arr("keys", np.zeros((3, 2), np.uint32)), r"3 sample keys for 4 residuals"),
    ("state_key shape", _arr("state_key", np.zeros(3, np.uint32)), r"state_key must be a raw threefry key"),
    ("state_key dtype", _arr("state_key", np.zeros(2, np.int32)), r"state_key must be a raw threefry key"),
    ("extra entry", _arr("evil", np.zeros(1)), r"unexpected entries \['evil'\]"),
    ("missing entry", lambda a: a.pop("keys"), r"missing entries \['keys'\]"),
]


@pytest.mark.parametrize("case", ARRAY_CASES, ids=[c[0] for c in ARRAY_CASES])
def test_arrays_not_matching_the_index_are_a_checkpoint_error(case, written, tmp_path):
    _, change, msg = case
    d = copy_dir(written, str(tmp_path / "c"))
    rewrite_npz(d, change)
    with pytest.raises(sv.CheckpointError, match=msg):
        sv.load_checkpoint(d, pos0())


def test_directories_where_files_should_be(written, tmp_path):
    d = copy_dir(written, str(tmp_path / "c"))
    os.remove(os.path.join(d, "state-000001.npz"))
    os.makedirs(os.path.join(d, "state-000001.npz"))
    with pytest.raises(sv.CheckpointError, match="are a directory"):
        sv.load_checkpoint(d, pos0())
    os.remove(os.path.join(d, "latest.json"))
    os.makedirs(os.path.join(d, "latest.json"))
    with pytest.raises(sv.CheckpointError, match="is a directory"):
        sv.load_checkpoint(d, pos0())
    with pytest.raises(sv.CheckpointError, match="'latest.json' there is not a regular file"):
        sv.optimize_kl(
            make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=2, checkpoint_dir=d, resume=True, **KW
        )


def test_npz_outside_the_directory_is_never_read(written, tmp_path):
    """An index naming an ``npz`` outside the checkpoint directory (``../other/state-000002.npz``) is refused."""
    d = copy_dir(written, str(tmp_path / "c"))
    other = copy_dir(written, str(tmp_path / "other"))
    meta = index(d)
    meta["npz"] = os.path.join("..", "other", "state-000001.npz")
    write_index(d, meta)
    with pytest.raises(sv.CheckpointError, match="npz must be a bare file name"):
        sv.optimize_kl(
            make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=2, checkpoint_dir=d, resume=True, **KW
        )
    assert os.path.exists(other)


def test_version_1_checkpoints_still_load(written, tmp_path):
    d = copy_dir(written, str(tmp_path / "c"))
    meta = index(d)
    for k in ("files", "fingerprint"):
        del meta[k]
    meta["format"] = "shardvi-checkpoint-v1"
    write_index(d, meta)
    ref, st_ref = sv.load_checkpoint(written, pos0())
    got, st = sv.load_checkpoint(d, pos0(), fingerprint=ckpt.fingerprint(make_lh(), pos0()))
    assert st.nit == st_ref.nit
    for a, b in zip(leaves(ref), leaves(got)):
        np.testing.assert_array_equal(a, b)


# -- 6. checkpoint_dir is checked before iteration 0; files follow the umask ----------------------------


def bad_dirs(tmp_path):
    (tmp_path / "afile").write_text("x")
    return [
        ("a file", str(tmp_path / "afile"), sv.CheckpointError, "checkpoint_dir .*afile.* is not a directory"),
        ("under a file", str(tmp_path / "afile" / "sub"), sv.CheckpointError, "checkpoint_dir .* cannot be created"),
        ("empty", "", ValueError, "checkpoint_dir must be a non-empty path"),
        ("not a path", 42, TypeError, "checkpoint_dir must be a path"),
    ]


@pytest.mark.parametrize("i", range(4), ids=["a file", "under a file", "empty", "not a path"])
def test_unusable_checkpoint_dir_fails_before_iteration_0(i, tmp_path):
    _, d, exc, msg = bad_dirs(tmp_path)[i]
    calls = []
    with pytest.raises(exc, match=msg):
        sv.optimize_kl(
            make_lh(),
            pos0(),
            key=jax.random.PRNGKey(0),
            n_total_iterations=1,
            checkpoint_dir=d,
            callback=lambda s, st: calls.append(st.nit),
            **KW,
        )
    assert calls == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_checkpoint_dir_fails_before_iteration_0(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        with pytest.raises(sv.CheckpointError, match="checkpoint_dir .* is not writable"):
            sv.optimize_kl(
                make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=1, checkpoint_dir=str(d), **KW
            )
    finally:
        d.chmod(0o755)


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_checkpoint_files_follow_the_umask(umask, tmp_path):
    d = str(tmp_path / "ck")
    old = os.umask(umask)
    try:
        save_synthetic(d, [1, 2])
    finally:
        os.umask(old)
    for f in ("latest.json", "state-000002.npz"):
        assert stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode) == 0o666 & ~umask, f
