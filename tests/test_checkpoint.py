"""Array-only checkpoints: bitwise resume, atomic files, clear errors, no pickle."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv

N = 6


def make_lh(n=N):
    rng = np.random.default_rng(0)
    model = sv.Model(lambda x: jnp.exp(0.5 * x["f"]) + x["g"],
                     {"f": jax.ShapeDtypeStruct((n,), jnp.float64), "g": jax.ShapeDtypeStruct((), jnp.float64)})
    return sv.Gaussian(np.exp(0.3 * rng.normal(size=n)) + 0.2, noise_std=0.2).amend(model)


KW = dict(n_samples=2, sample_mode=lambda i: "nonlinear_resample" if i < 2 else "nonlinear_update",
          linear_sampling=sv.CGConfig(tol=1e-8), nonlinear_update=sv.NewtonCGConfig(xtol=1e-8, maxiter=5),
          kl_minimization=sv.NewtonCGConfig(xtol=1e-8, maxiter=5))


def pos0(n=N):
    return {"f": jnp.zeros(n), "g": jnp.zeros(())}


def leaves(samples):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves((samples.pos, samples.residuals, samples.keys))]


def test_resume_is_bitwise_equal(tmp_path):
    lh = make_lh()
    key = jax.random.PRNGKey(9)
    straight, st_straight = sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=4, **KW)
    d = str(tmp_path / "ck")
    sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=2, checkpoint_dir=d, **KW)
    resumed, st_resumed = sv.optimize_kl(lh, pos0(), key=key, n_total_iterations=4, checkpoint_dir=d,
                                         resume=True, **KW)
    assert st_resumed.nit == 4 and len(st_resumed.history) == 4
    for a, b in zip(leaves(straight), leaves(resumed)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(np.asarray(st_straight.key), np.asarray(st_resumed.key))
    assert [r.kl_energy for r in st_straight.history] == [r.kl_energy for r in st_resumed.history]


def test_checkpoint_files_and_no_pickle(tmp_path):
    d = str(tmp_path / "ck")
    samples, state = sv.optimize_kl(make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=3,
                                    checkpoint_dir=d, **KW)
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


def test_resume_without_checkpoint_starts_fresh(tmp_path):
    d = str(tmp_path / "empty")
    a, _ = sv.optimize_kl(make_lh(), pos0(), key=jax.random.PRNGKey(1), n_total_iterations=1,
                          checkpoint_dir=d, resume=True, **KW)
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
        sv.optimize_kl(make_lh(), pos0(), key=jax.random.PRNGKey(0), n_total_iterations=2, checkpoint_dir=d,
                       resume=True, **KW)


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
