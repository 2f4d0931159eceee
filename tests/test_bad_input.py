"""Bad input gives a clear ValueError/TypeError that names the argument."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv

N = 4
DOMAIN = jax.ShapeDtypeStruct((N,), jnp.float64)
MODEL = sv.Model(lambda x: jnp.exp(x), DOMAIN)
DATA = np.ones(N)
LH = sv.Gaussian(DATA, noise_std=0.5).amend(MODEL)
DICT_LH = sv.Gaussian(DATA, noise_std=0.5).amend(
    sv.Model(lambda x: jnp.exp(x["a"]) + x["b"], {"a": DOMAIN, "b": jax.ShapeDtypeStruct((), jnp.float64)}))
KEY = jax.random.PRNGKey(0)


def run(**kw):
    args = dict(likelihood=LH, position=jnp.zeros(N), key=KEY, n_total_iterations=1, n_samples=1,
                sample_mode="linear_resample")
    args.update(kw)
    lh = args.pop("likelihood")
    pos = args.pop("position")
    return sv.optimize_kl(lh, pos, **args)


CASES = [
    # (id, callable, exception, message regex)
    ("negative n_samples", lambda: run(n_samples=-1), ValueError, "n_samples"),
    ("float n_samples", lambda: run(n_samples=2.5), TypeError, "n_samples"),
    ("zero n_samples nonlinear", lambda: run(n_samples=0, sample_mode="nonlinear_resample"), ValueError,
     "n_samples=0"),
    ("callable n_samples bad later", lambda: run(n_samples=lambda i: 1 - 2 * i, n_total_iterations=2),
     ValueError, "n_samples.*iteration 1"),
    ("unknown sample_mode", lambda: run(sample_mode="linear_fancy"), ValueError, "sample_mode"),
    ("unknown callable sample_mode", lambda: run(sample_mode=lambda i: "nope"), ValueError, "sample_mode"),
    ("unknown sample_map", lambda: run(sample_map="magic"), ValueError, "sample_map"),
    ("bad kl_map type", lambda: run(kl_map=42), TypeError, "kl_map"),
    ("non-finite position", lambda: run(position=jnp.array([0.0, np.nan, 0.0, 0.0])), ValueError,
     "position.*non-finite"),
    ("position wrong shape", lambda: run(position=jnp.zeros(N + 1)), ValueError, "position"),
    ("position wrong structure", lambda: run(position={"a": jnp.zeros(N)}), ValueError, "position"),
    ("missing key", lambda: run(key=None), TypeError, "key"),
    ("bad key", lambda: run(key=jnp.zeros(3)), TypeError, "key"),
    ("negative iterations", lambda: run(n_total_iterations=-2), ValueError, "n_total_iterations"),
    ("likelihood type", lambda: run(likelihood=lambda x: x), TypeError, "likelihood"),
    ("linear_sampling type", lambda: run(linear_sampling=sv.NewtonCGConfig()), TypeError, "linear_sampling"),
    ("kl_minimization type", lambda: run(kl_minimization=sv.CGConfig()), TypeError, "kl_minimization"),
    ("mirror_samples type", lambda: run(mirror_samples="yes"), TypeError, "mirror_samples"),
    ("resume without dir", lambda: run(resume=True), ValueError, "checkpoint_dir"),
    ("callback not callable", lambda: run(callback=3), TypeError, "callback"),
    ("point_estimates unknown key", lambda: run(likelihood=DICT_LH, position={"a": jnp.zeros(N), "b": 0.0},
                                                point_estimates=("c",)), ValueError, "point_estimates"),
    ("constants on array domain", lambda: run(constants=("a",)), TypeError, "constants"),
    ("non-finite data", lambda: sv.Gaussian(np.array([1.0, np.inf]), noise_std=1.0), ValueError, "data"),
    ("zero noise", lambda: sv.Gaussian(DATA, noise_std=0.0), ValueError, "noise_std"),
    ("negative noise array", lambda: sv.Gaussian(DATA, noise_std=-np.ones(N)), ValueError, "noise_std"),
    ("nan noise_cov_inv", lambda: sv.Gaussian(DATA, noise_cov_inv=np.nan), ValueError, "noise_cov_inv"),
    ("no noise", lambda: sv.Gaussian(DATA), ValueError, "noise_std"),
    ("data/model shape mismatch", lambda: sv.Gaussian(np.ones(N + 2), noise_std=1.0).amend(MODEL), ValueError,
     "model"),
    ("negative counts", lambda: sv.Poisson(np.array([1.0, -1.0])), ValueError, "counts"),
    ("student dof", lambda: sv.StudentT(DATA, dof=0.0, noise_std=1.0), ValueError, "dof"),
    ("model domain not ShapeDtypeStruct", lambda: sv.Model(lambda x: x, (3,)), TypeError, "domain"),
    ("model call not callable", lambda: sv.Model(3, DOMAIN), TypeError, "call"),
    ("CG tol nan", lambda: sv.CGConfig(tol=float("nan")), ValueError, "tol"),
    ("CG miniter > maxiter", lambda: sv.CGConfig(miniter=5, maxiter=2), ValueError, "miniter"),
    ("Newton maxiter float", lambda: sv.NewtonCGConfig(maxiter=2.0), TypeError, "maxiter"),
    ("Newton cg wrong type", lambda: sv.NewtonCGConfig(cg=3), TypeError, "cg"),
    ("optax wrong optimizer", lambda: sv.OptaxConfig(optimizer="adam"), TypeError, "optimizer"),
    ("compiler_options not a dict", lambda: run(compiler_options=["xla_cpu_use_fusion_emitters"]), TypeError,
     "compiler_options"),
    ("compiler_options value type", lambda: run(compiler_options={"xla_cpu_use_fusion_emitters": None}),
     TypeError, "compiler_options"),
    ("compiler_options unknown XLA option", lambda: run(compiler_options={"xla_no_such_option": True}), ValueError,
     "compiler_options.*xla_no_such_option"),
    ("compiler_options bad XLA value", lambda: run(compiler_options={"xla_backend_optimization_level": "high"}),
     ValueError, "compiler_options.*xla_backend_optimization_level"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case):
    _, fn, exc, msg = case
    with pytest.raises(exc, match=msg):
        fn()


def test_error_messages_are_not_jax_internal():
    """Errors are raised before anything is traced: no JAX frames in the message."""
    with pytest.raises(ValueError) as info:
        run(position=jnp.full(N, np.inf))
    assert "Traced" not in str(info.value) and "jax" not in str(info.value).lower()
