"""Hostile arguments of the checkpoint functions, the CLI, the planner, ``Samples`` and the ELBO: a clear
``TypeError`` / ``ValueError`` naming the argument before any work or any file is written."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _timeouts import scaled

import shardvi as sv
from shardvi.parallel.memory import InsufficientMemoryError
from shardvi.vi import checkpoint as ckpt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small():
    model = sv.Model(lambda x: 0.5 * x, jax.ShapeDtypeStruct((4,), jnp.float64))
    lh = sv.Gaussian(jnp.ones(4), noise_std=0.5).amend(model)
    r = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4)))
    samples = sv.Samples(jnp.full(4, 0.1), r, jnp.asarray(jax.random.split(jax.random.PRNGKey(1), 2)))
    return lh, samples


def state(nit=1):
    return sv.OptimizeVIState(nit, jax.random.PRNGKey(0))


def files(d):
    return sorted(os.listdir(d))


def cli(*args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-m", "shardvi", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=scaled(120),
    )


def test_save_refuses_a_bad_fingerprint_and_keeps_the_good_checkpoint(tmp_path):
    lh, s = small()
    d = tmp_path / "ck"
    sv.save_checkpoint(d, s, state(1), fingerprint=ckpt.fingerprint(lh, s.pos))
    before = {f: (d / f).read_bytes() for f in files(d)}
    for bad, err in (
        ("abc", TypeError),
        ({"likelihood": 3}, ValueError),
        ({"settings": {"t": jnp.ones(2)}}, TypeError),
    ):
        with pytest.raises(err, match="fingerprint"):
            sv.save_checkpoint(d, s, state(2), fingerprint=bad)
    assert {f: (d / f).read_bytes() for f in files(d)} == before  # no state-000002.npz, the same index
    sv.load_checkpoint(d, s.pos, fingerprint=ckpt.fingerprint(lh, s.pos))


def test_save_refuses_a_bad_fingerprint_before_creating_the_directory(tmp_path):
    _, s = small()
    with pytest.raises(TypeError, match="fingerprint"):
        sv.save_checkpoint(tmp_path / "new", s, state(), fingerprint=[1, 2])
    assert not (tmp_path / "new").exists()


def test_save_refuses_a_history_that_would_not_load_back(tmp_path):
    from shardvi.vi.diagnostics import IterationReport

    _, s = small()
    good = IterationReport(1, "linear_resample", 1, 2.0, [3], [], 4, 5, 0, 1.0, 1.0, 0.1)
    d = tmp_path / "ck"
    for bad, err, match in (
        (good._replace(kl_energy="2.0"), ValueError, r"history\[0\]\.kl_energy must be a number"),
        (good._replace(wall_time=jnp.ones(2)), ValueError, "state.history cannot be written as JSON"),
    ):
        with pytest.raises(err, match=match):
            sv.save_checkpoint(d, s, state()._replace(history=(bad,)))
    assert not d.exists()
    sv.save_checkpoint(d, s, state()._replace(history=(good,)))
    assert sv.load_checkpoint(d, s.pos)[1].history == (good,)


def test_fingerprint_refuses_non_json_settings():
    lh, s = small()
    with pytest.raises(TypeError, match="fingerprint setting tag must be None, a bool"):
        ckpt.fingerprint(lh, s.pos, tag=jnp.ones(2))
    fp = ckpt.fingerprint(lh, s.pos, a=np.float64(0.5), b=jnp.asarray(3), c={"x": np.bool_(True)})
    assert fp["settings"] == {"a": 0.5, "b": [["", 3]], "c": ["['x']"]}
    json.dumps(fp)


def test_nan_setting_matches_nan(tmp_path):
    """A NaN setting is stored as NaN and compares equal to NaN (a different value still differs)."""
    lh, s = small()
    sv.save_checkpoint(tmp_path, s, state(), fingerprint=ckpt.fingerprint(lh, s.pos, tol=float("nan"), lim=[np.inf]))
    sv.load_checkpoint(tmp_path, s.pos, fingerprint=ckpt.fingerprint(lh, s.pos, tol=np.nan, lim=[np.inf]))
    with pytest.raises(ckpt.CheckpointError, match="tol: nan in the checkpoint, 0.1 now"):
        sv.load_checkpoint(tmp_path, s.pos, fingerprint=ckpt.fingerprint(lh, s.pos, tol=0.1, lim=[np.inf]))


@pytest.mark.parametrize(
    "kw, err, match",
    [
        (dict(fingerprint="x"), TypeError, "fingerprint must be None or a dict"),
        (dict(fingerprint={"latent": 1}), ValueError, "fingerprint must be null or"),
        (dict(check_history="x"), TypeError, "check_history must be None or a callable"),
        (dict(check_history=lambda h: "differs"), TypeError, "check_history must return a list of str"),
        (dict(force="yes"), TypeError, "force must be a bool, got str"),
        (dict(force="no"), TypeError, "force must be a bool, got str"),
    ],
)
def test_load_checks_its_arguments(tmp_path, kw, err, match):
    lh, s = small()
    sv.save_checkpoint(tmp_path, s, state(), fingerprint=ckpt.fingerprint(lh, s.pos))
    with pytest.raises(err, match=match):
        sv.load_checkpoint(tmp_path, s.pos, **kw)
    got, st = sv.load_checkpoint(tmp_path, s.pos, force=np.bool_(False))
    assert st.nit == 1


def test_failed_index_write_removes_the_new_arrays(tmp_path, monkeypatch):
    from shardvi.vi.checkpoint import store

    _, s = small()
    sv.save_checkpoint(tmp_path, s, state(1))
    before = {f: (tmp_path / f).read_bytes() for f in files(tmp_path)}
    real = store._atomic_write

    def fail_on_index(path, write):
        if path.endswith("latest.json"):
            raise OSError(28, "No space left on device")
        real(path, write)

    monkeypatch.setattr(store, "_atomic_write", fail_on_index)
    with pytest.raises(ckpt.CheckpointError, match="No space left"):
        sv.save_checkpoint(tmp_path, s, state(2))
    assert {f: (tmp_path / f).read_bytes() for f in files(tmp_path)} == before


def test_cli_devices_bounded():
    r = cli("plan", "--devices", "100000", "--npix", "8", "--n-samples", "1")
    assert r.returncode == 2
    assert "argument --devices: expected an integer from 1 to 2048, got 100000" in r.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    "args, line",
    [
        (["plan", "--memory-limit", "inf"], "argument --memory-limit: expected a finite number of GiB from 2**-30"),
        (["plan", "--memory-limit", "1e-12"], "argument --memory-limit: expected a finite number of GiB from 2**-30"),
        (["plan", "--memory-limit", "1e300"], "to below 2**33 (8 EiB), got '1e300'"),
        (["compare", "--seed", "99999999999999999999"], "argument --seed: expected an integer in [0, 2**63)"),
        (["compare", "--seed", "-1"], "argument --seed: expected an integer in [0, 2**63), got -1"),
        (["compare", "--iterations", "-1"], "argument --iterations: expected an integer >= 0, got -1"),
        (["compare", "--chunk-size", str(2**64)], "argument --chunk-size: expected an integer from 1 to 2147483647"),
    ],
)
def test_cli_flag_values(args, line):
    """Parsed before JAX is imported: exit status 2 and one usage error naming the flag."""
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert line in r.stderr.splitlines()[-1] and "Traceback" not in r.stderr


def test_cli_plan_that_cannot_fit_is_one_error_line():
    r = cli("plan", "--devices", "1", "--npix", "8", "--n-samples", str(10**20))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith(f"error: optimize_kl with n_samples={10**20} cannot fit")


def test_cli_memory_limit_reaches_plan_in_bytes(monkeypatch, capsys):
    import shardvi.vi.planner as planner
    from shardvi.__main__ import main

    seen = {}
    monkeypatch.setattr(planner, "plan", lambda *a, **kw: seen.update(kw) or "a plan")
    assert main(["plan", "--devices", "1", "--npix", "8", "--memory-limit", "0.5"]) == 0
    assert seen["memory_limit"] == 2**29 and "a plan" in capsys.readouterr().out


def test_flags_must_be_bools():
    lh, s = small()
    with pytest.raises(TypeError, match="correct_bias must be a bool, got str"):
        s.mean_and_std(correct_bias="no")
    with pytest.raises(TypeError, match="measure must be a bool, got str"):
        sv.parallel.plan(lh, s.pos, n_samples=1, measure="no")
    with pytest.raises(TypeError, match="mirror_samples must be a bool, got int"):
        sv.parallel.plan(lh, s.pos, n_samples=1, mirror_samples=1)
    with pytest.raises(TypeError, match="normalized must be a bool, got str"):
        sv.estimate_evidence_lower_bound(lh, s, normalized="no")
    np.testing.assert_array_equal(
        s.mean_and_std(correct_bias=np.bool_(False))[1], s.mean_and_std(correct_bias=False)[1]
    )


def test_elbo_checks_the_key_with_every_method():
    lh, s = small()
    with pytest.raises(TypeError, match="key must be a jax.random key"):
        sv.estimate_evidence_lower_bound(lh, s, method="dense", key="not a key")
    with pytest.raises(TypeError, match="key must be one threefry2x32"):
        sv.estimate_evidence_lower_bound(lh, s, method="dense", key=jax.random.split(jax.random.PRNGKey(0), 3))


def test_elbo_slq_probes_held_against_the_memory_limit():
    lh, s = small()
    with pytest.raises(InsufficientMemoryError, match=r"n_probes=1000000000 .* at most n_probes=\d+ fit"):
        sv.estimate_evidence_lower_bound(lh, s, method="slq", n_probes=10**9, lanczos_order=2, memory_limit=10**9)


def test_std_of_one_unmirrored_sample_is_nan():
    """Bessel's correction of one sample is undefined (NumPy: nan); uncorrected it is 0; n = 0 keeps std 0."""
    one = sv.Samples(jnp.zeros(3), jnp.array([[1.0, -2.0, 3.0]]))
    mean, std = one.mean_and_std()
    np.testing.assert_array_equal(mean, [1.0, -2.0, 3.0])
    assert np.all(np.isnan(std))
    np.testing.assert_array_equal(one.mean_and_std(correct_bias=False)[1], np.zeros(3))
    assert one.mean_and_std(lambda x: x * 1j)[1].dtype == np.float64
    none = sv.Samples(jnp.ones(3), jnp.zeros((0, 3)))
    np.testing.assert_array_equal(none.mean_and_std()[1], np.zeros(3))
