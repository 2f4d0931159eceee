"""Bad input gives a clear ValueError/TypeError that names the argument."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardvi as sv

N = 4
DOMAIN = jax.ShapeDtypeStruct((N,), jnp.float64)
MODEL = sv.Model(lambda x: jnp.exp(x), DOMAIN)
DATA = np.ones(N)
LH = sv.Gaussian(DATA, noise_std=0.5).amend(MODEL)
DICT_LH = sv.Gaussian(DATA, noise_std=0.5).amend(
    sv.Model(lambda x: jnp.exp(x["a"]) + x["b"], {"a": DOMAIN, "b": jax.ShapeDtypeStruct((), jnp.float64)})
)
KEY = jax.random.PRNGKey(0)


POS, RES = jnp.zeros(N), jnp.zeros((2, N))  # a latent position and two residuals (one antithetic pair)
TUPLE_DATA = (np.ones(2), np.ones(2))
F32 = jax.ShapeDtypeStruct((N,), jnp.float32)


def _optimizer(init, update):
    """A duck-typed (or wrongly written) optax optimizer."""
    return sv.OptaxConfig(optax.GradientTransformation(init, update))


class _DropsSampleAxis(sv.parallel.Strategy):
    """A strategy whose ``map`` returns the first sample only."""

    name = "drops"

    def map(self, fn, in_axes):
        return lambda *args: fn(*args)[0]

    def mean(self, stacked):
        return stacked


class _MeanKeepsAxis(_DropsSampleAxis):
    """``map`` is right, ``mean`` returns the stacked values unreduced."""

    def map(self, fn, in_axes):
        return jax.vmap(fn, in_axes=in_axes)


class _RaisingMap(_DropsSampleAxis):
    def map(self, fn, in_axes):
        raise RuntimeError("not implemented")


def _devices_gen():
    yield from jax.devices()[:2]


def run(**kw):
    args = dict(
        likelihood=LH, position=jnp.zeros(N), key=KEY, n_total_iterations=1, n_samples=1, sample_mode="linear_resample"
    )
    args.update(kw)
    lh = args.pop("likelihood")
    pos = args.pop("position")
    return sv.optimize_kl(lh, pos, **args)


CASES = [
    # (id, callable, exception, message regex)
    ("negative n_samples", lambda: run(n_samples=-1), ValueError, "n_samples"),
    ("float n_samples", lambda: run(n_samples=2.5), TypeError, "n_samples"),
    ("zero n_samples nonlinear", lambda: run(n_samples=0, sample_mode="nonlinear_resample"), ValueError, "n_samples=0"),
    (
        "callable n_samples bad later",
        lambda: run(n_samples=lambda i: 1 - 2 * i, n_total_iterations=2),
        ValueError,
        "n_samples.*iteration 1",
    ),
    ("unknown sample_mode", lambda: run(sample_mode="linear_fancy"), ValueError, "sample_mode"),
    ("unknown callable sample_mode", lambda: run(sample_mode=lambda i: "nope"), ValueError, "sample_mode"),
    ("unknown sample_map", lambda: run(sample_map="magic"), ValueError, "sample_map"),
    ("bad kl_map type", lambda: run(kl_map=42), TypeError, "kl_map"),
    (
        "non-finite position",
        lambda: run(position=jnp.array([0.0, np.nan, 0.0, 0.0])),
        ValueError,
        "position.*non-finite",
    ),
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
    (
        "point_estimates unknown key",
        lambda: run(likelihood=DICT_LH, position={"a": jnp.zeros(N), "b": 0.0}, point_estimates=("c",)),
        ValueError,
        "point_estimates",
    ),
    ("constants on array domain", lambda: run(constants=("a",)), TypeError, "constants"),
    ("non-finite data", lambda: sv.Gaussian(np.array([1.0, np.inf]), noise_std=1.0), ValueError, "data"),
    ("zero noise", lambda: sv.Gaussian(DATA, noise_std=0.0), ValueError, "noise_std"),
    ("negative noise array", lambda: sv.Gaussian(DATA, noise_std=-np.ones(N)), ValueError, "noise_std"),
    ("nan noise_cov_inv", lambda: sv.Gaussian(DATA, noise_cov_inv=np.nan), ValueError, "noise_cov_inv"),
    ("no noise", lambda: sv.Gaussian(DATA), ValueError, "noise_std"),
    ("data/model shape mismatch", lambda: sv.Gaussian(np.ones(N + 2), noise_std=1.0).amend(MODEL), ValueError, "model"),
    ("negative counts", lambda: sv.Poisson(np.array([1.0, -1.0])), ValueError, "counts"),
    ("student dof", lambda: sv.StudentT(DATA, dof=0.0, noise_std=1.0), ValueError, "dof"),
    ("model domain not ShapeDtypeStruct", lambda: sv.Model(lambda x: x, (3,)), TypeError, "domain"),
    ("model call not callable", lambda: sv.Model(3, DOMAIN), TypeError, "call"),
    ("CG tol nan", lambda: sv.CGConfig(tol=float("nan")), ValueError, "tol"),
    ("CG miniter > maxiter", lambda: sv.CGConfig(miniter=5, maxiter=2), ValueError, "miniter"),
    ("Newton maxiter float", lambda: sv.NewtonCGConfig(maxiter=2.0), TypeError, "maxiter"),
    ("Newton cg wrong type", lambda: sv.NewtonCGConfig(cg=3), TypeError, "cg"),
    ("optax wrong optimizer", lambda: sv.OptaxConfig(optimizer="adam"), TypeError, "optimizer"),
    (
        "compiler_options not a dict",
        lambda: run(compiler_options=["xla_cpu_use_fusion_emitters"]),
        TypeError,
        "compiler_options",
    ),
    (
        "compiler_options value type",
        lambda: run(compiler_options={"xla_cpu_use_fusion_emitters": None}),
        TypeError,
        "compiler_options",
    ),
    (
        "compiler_options unknown XLA option",
        lambda: run(compiler_options={"xla_no_such_option": True}),
        ValueError,
        "compiler_options.*xla_no_such_option",
    ),
    (
        "compiler_options bad XLA value",
        lambda: run(compiler_options={"xla_backend_optimization_level": "high"}),
        ValueError,
        "compiler_options.*xla_backend_optimization_level",
    ),
    # -- complex values on a real latent space
    ("complex position", lambda: run(position=jnp.zeros(N) + 1j), TypeError, "position.*complex"),
    (
        "complex Model domain",
        lambda: sv.Model(lambda x: x, jax.ShapeDtypeStruct((N,), jnp.complex128)),
        TypeError,
        "domain.*real",
    ),
    (
        "complex latent likelihood",
        lambda: run(likelihood=sv.Gaussian(DATA + 1j, noise_std=1.0), position=jnp.zeros(N, jnp.complex128)),
        TypeError,
        "likelihood.*complex",
    ),
    # -- noise containers whose structure is not the data's
    (
        "noise_std list for tuple data",
        lambda: sv.Gaussian(TUPLE_DATA, noise_std=[0.1, 0.2]),
        ValueError,
        "noise_std.*structure",
    ),
    (
        "noise_std tuple of wrong length",
        lambda: sv.Gaussian(TUPLE_DATA, noise_std=(0.1, 0.2, 0.3)),
        ValueError,
        "noise_std.*structure",
    ),
    (
        "noise_cov_inv dict for list data",
        lambda: sv.Gaussian([np.ones(2), np.ones(2)], noise_cov_inv={"a": 1.0}),
        ValueError,
        "noise_cov_inv.*structure",
    ),
    (
        "StudentT noise_std list for tuple data",
        lambda: sv.StudentT(TUPLE_DATA, 3.0, [0.1, 0.2]),
        ValueError,
        "noise_std.*structure",
    ),
    ("noise_std ragged list", lambda: sv.Gaussian(DATA, noise_std=[0.1, [0.2, 0.3]]), TypeError, "noise_std"),
    ("noise_std complex", lambda: sv.Gaussian(DATA, noise_std=0.1 + 0j), TypeError, "noise_std.*real"),
    # -- devices that a one-device strategy would ignore
    (
        "devices with vmap",
        lambda: run(sample_map="vmap", devices=jax.devices()[:2]),
        ValueError,
        "devices.*sample_map='vmap'",
    ),
    (
        "devices with lax_map",
        lambda: run(kl_map="lax_map", sample_map="shard_map", devices=jax.devices()[:2]),
        ValueError,
        "devices.*kl_map='lax_map'",
    ),
    (
        "devices with Vmap object",
        lambda: run(sample_map=sv.parallel.Vmap(), devices=jax.devices()[:2]),
        ValueError,
        r"devices.*Vmap\(\)",
    ),
    (
        "devices with LaxMap object",
        lambda: run(sample_map="shard_map", kl_map=sv.parallel.LaxMap(), devices=jax.devices()[:3]),
        ValueError,
        r"devices.*LaxMap\(\)",
    ),
    ("vmap on another device", lambda: run(devices=jax.devices()[1:2]), ValueError, "devices.*runs on"),
    (
        "devices with ShardMap object",
        lambda: run(
            sample_map=sv.parallel.ShardMap(devices=jax.devices()[:2]), kl_map="shard_map", devices=jax.devices()[:4]
        ),
        ValueError,
        "devices.*ShardMap",
    ),
    # -- dtypes of the model output and the data
    (
        "float32 data, float64 model",
        lambda: sv.Gaussian(DATA.astype(np.float32), noise_std=0.5).amend(MODEL),
        TypeError,
        "model.*float64.*data.*float32",
    ),
    (
        "float64 data, float32 model",
        lambda: sv.Gaussian(DATA, noise_std=0.5).amend(sv.Model(jnp.exp, F32)),
        TypeError,
        "model.*float32.*data.*float64",
    ),
    (
        "bfloat16 model",
        lambda: sv.Gaussian(DATA, noise_std=0.5).amend(sv.Model(jnp.exp, jax.ShapeDtypeStruct((N,), jnp.bfloat16))),
        TypeError,
        "bfloat16.*float64",
    ),
    (
        "complex64 data, complex128 model",
        lambda: sv.Gaussian(np.ones(N, np.complex64), noise_std=0.5).amend(sv.Model(lambda x: jnp.exp(1j * x), DOMAIN)),
        TypeError,
        "complex128.*complex64",
    ),
    (
        "dtype mismatch names the leaf",
        lambda: sv.Gaussian({"a": DATA, "b": DATA.astype(np.float32)}, noise_std=0.5).amend(
            sv.Model(lambda x: {"a": x, "b": x}, DOMAIN)
        ),
        TypeError,
        r"\['b'\]",
    ),
    # -- optimizers that cannot run are refused at construction (see also test_minimizers)
    (
        "optimizer update not a pair",
        lambda: run(kl_minimization=_optimizer(lambda p: (), lambda g, s, p=None: g)),
        TypeError,
        r"kl_minimization\.optimizer\.update must return a pair",
    ),
    (
        "optimizer updates wrong shape",
        lambda: run(kl_minimization=_optimizer(lambda p: (), lambda g, s, p=None: (jnp.zeros(N + 1), s))),
        TypeError,
        r"kl_minimization\.optimizer\.update.*shape",
    ),
    (
        "optimizer state changes type",
        lambda: run(
            kl_minimization=_optimizer(lambda p: jnp.zeros((), jnp.int32), lambda g, s, p=None: (g, jnp.zeros(2)))
        ),
        TypeError,
        r"kl_minimization\.optimizer\.update.*state",
    ),
    (
        "optimizer init raises",
        lambda: run(kl_minimization=_optimizer(lambda p: 1 / 0, lambda g, s, p=None: (g, s))),
        TypeError,
        r"kl_minimization\.optimizer\.init",
    ),
    (
        "optimizer init not callable",
        lambda: sv.OptaxConfig(optax.GradientTransformation(3, lambda g, s: (g, s))),
        TypeError,
        "optimizer",
    ),
    # -- empty data, strategy classes, keys of other kinds, bad settings callables, overflowing noise, broken strategies
    ("empty data", lambda: sv.Gaussian(np.zeros(0), noise_std=1.0), ValueError, "data.*empty"),
    (
        "empty counts leaf",
        lambda: sv.Poisson({"a": np.ones(2), "b": np.zeros((3, 0))}),
        ValueError,
        "counts leaf 1.*empty",
    ),
    (
        "strategy class",
        lambda: run(sample_map=sv.parallel.ShardMap),
        TypeError,
        "sample_map.*class ShardMap.*instantiate",
    ),
    ("strategy class Vmap", lambda: run(kl_map=sv.parallel.Vmap), TypeError, "kl_map.*instantiate"),
    ("rbg key", lambda: run(key=jax.random.key(1, impl="rbg")), TypeError, "threefry2x32"),
    ("batch of keys", lambda: run(key=jax.random.split(KEY, 3)), TypeError, "key.*batch"),
    (
        "sample_mode returns garbage",
        lambda: run(sample_mode=lambda i: "sideways"),
        ValueError,
        r"sample_mode\(0\) returned 'sideways'",
    ),
    ("sample_mode returns a number", lambda: run(sample_mode=lambda i: 3), TypeError, r"sample_mode\(0\) returned 3"),
    (
        "noise_std overflows float64",
        lambda: sv.Gaussian(DATA, noise_std=1e-200),
        ValueError,
        r"noise_std.*1/noise_std\*\*2 overflows float64",
    ),
    (
        "noise_std overflows float32",
        lambda: sv.Gaussian(DATA.astype(np.float32), noise_std=1e-30),
        ValueError,
        "noise_std.*overflows float32",
    ),
    (
        "noise_std underflows",
        lambda: sv.Gaussian(DATA, noise_std=np.array([1.0, 1.0, 1e200, 1.0])),
        ValueError,
        "noise_std.*underflows",
    ),
    ("StudentT noise_std overflows", lambda: sv.StudentT(DATA, 3.0, 1e-200), ValueError, "noise_std.*overflows"),
    (
        "noise_std not representable",
        lambda: sv.Gaussian(DATA.astype(np.float32), noise_std=1e-50),
        ValueError,
        "noise_std.*float32",
    ),
    (
        "strategy map drops the sample axis",
        lambda: run(sample_map=_DropsSampleAxis()),
        TypeError,
        r"sample_map.*_DropsSampleAxis\.map",
    ),
    ("strategy mean keeps the axis", lambda: run(kl_map=_MeanKeepsAxis()), TypeError, r"kl_map.*_MeanKeepsAxis\.mean"),
    ("strategy map raises", lambda: run(sample_map=_RaisingMap()), TypeError, "sample_map.*failed on a probe"),
    (
        "devices generator with a bad entry",
        lambda: run(sample_map="shard_map", devices=(d for d in [3])),
        TypeError,
        r"devices\[0\]",
    ),
    # -- the other public functions
    (
        "draw_linear_residual batch of keys",
        lambda: sv.draw_linear_residual(LH, POS, jax.random.split(KEY, 4)),
        TypeError,
        "key.*batch",
    ),
    (
        "draw_linear_residual wrong shape",
        lambda: sv.draw_linear_residual(LH, jnp.zeros(N + 1), KEY),
        ValueError,
        "pos leaf 0 has shape",
    ),
    (
        "draw_linear_residual wrong structure",
        lambda: sv.draw_linear_residual(LH, {"a": POS}, KEY),
        ValueError,
        "pos has tree structure",
    ),
    (
        "draw_linear_residual float32 pos",
        lambda: sv.draw_linear_residual(LH, jnp.zeros(N, jnp.float32), KEY),
        TypeError,
        "pos.*float32",
    ),
    (
        "draw_linear_residual config type",
        lambda: sv.draw_linear_residual(LH, POS, KEY, sv.NewtonCGConfig()),
        TypeError,
        "config must be a CGConfig",
    ),
    (
        "draw_linear_residual likelihood type",
        lambda: sv.draw_linear_residual(lambda x: x, POS, KEY),
        TypeError,
        "likelihood must be",
    ),
    (
        "nonlinear update residual shape",
        lambda: sv.nonlinearly_update_residual(LH, POS, RES, KEY, 1.0),
        ValueError,
        "residual leaf 0 has shape",
    ),
    (
        "nonlinear update sign array",
        lambda: sv.nonlinearly_update_residual(LH, POS, POS, KEY, jnp.ones(2)),
        TypeError,
        "metric_sample_sign",
    ),
    (
        "nonlinear update batch of keys",
        lambda: sv.nonlinearly_update_residual(LH, POS, POS, jax.random.split(KEY, 2), 1.0),
        TypeError,
        "key.*batch",
    ),
    (
        "nonlinear update config type",
        lambda: sv.nonlinearly_update_residual(LH, POS, POS, KEY, 1.0, sv.CGConfig()),
        TypeError,
        "config must be a NewtonCGConfig",
    ),
    ("Samples residual without sample axis", lambda: sv.Samples(POS, POS), ValueError, r"residuals leaf 0.*n_samples"),
    ("Samples residual wrong structure", lambda: sv.Samples(POS, {"a": RES}), ValueError, "residuals.*structure"),
    (
        "Samples residual dtype",
        lambda: sv.Samples(POS, RES.astype(jnp.float32)),
        TypeError,
        "residuals leaf 0 has dtype float32",
    ),
    (
        "Samples residual counts differ",
        lambda: sv.Samples({"a": POS, "b": POS}, {"a": RES, "b": RES[:1]}),
        ValueError,
        "different sample counts",
    ),
    ("Samples keys wrong dtype", lambda: sv.Samples(POS, RES, jnp.zeros((1, 2))), TypeError, "keys.*uint32"),
    (
        "Samples typed keys",
        lambda: sv.Samples(POS, RES, jax.random.split(jax.random.key(0), 1)),
        TypeError,
        "keys.*uint32",
    ),
    (
        "Samples keys wrong count",
        lambda: sv.Samples(POS, RES, jax.random.split(KEY, 3)),
        ValueError,
        "keys holds 3 keys for 2 residuals",
    ),
    ("Samples.at wrong shape", lambda: sv.Samples(POS, RES).at(jnp.zeros(N + 1)), ValueError, "pos leaf 0"),
    (
        "Samples.at wrong dtype",
        lambda: sv.Samples(POS, RES).at(jnp.zeros(N, jnp.float32)),
        TypeError,
        "pos leaf 0 has dtype float32",
    ),
    (
        "minisanity likelihood of another domain",
        lambda: sv.minisanity(sv.Samples(POS, RES), DICT_LH),
        ValueError,
        "likelihood.*domain",
    ),
    ("minisanity samples type", lambda: sv.minisanity(POS, LH), TypeError, "samples must be"),
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


def test_noise_containers_that_match_the_data_are_read_per_leaf():
    """Noise containers, the accepted forms: a pytree of the data's structure (per leaf), array-likes for one array."""
    d = (np.array([1.0, 2.0]), np.array([3.0]))
    s0 = (jnp.zeros(2), jnp.zeros(1))
    expected = 0.5 * (1.0 + 4.0) / 0.1**2 + 0.5 * 9.0 / 0.2**2
    for noise in ((0.1, 0.2), (np.full(2, 0.1), [0.2]), (0.1, np.array([0.2]))):
        np.testing.assert_allclose(float(sv.Gaussian(d, noise_std=noise).energy(s0)), expected, rtol=1e-14)
        prec = tuple(1.0 / np.asarray(v, float) ** 2 for v in noise)
        np.testing.assert_allclose(float(sv.Gaussian(d, noise_cov_inv=prec).energy(s0)), expected, rtol=1e-14)
    # a plain list of numbers for array data is an array
    a = sv.Gaussian(DATA, noise_std=[0.5, 1.0, 2.0, 4.0]).energy(jnp.zeros(N))
    b = sv.Gaussian(DATA, noise_std=np.array([0.5, 1.0, 2.0, 4.0])).energy(jnp.zeros(N))
    assert float(a) == float(b) == 0.5 * float(np.sum(1.0 / np.array([0.5, 1.0, 2.0, 4.0]) ** 2))
    # a dict of the data's keys with array-likes as values
    dd = {"a": np.ones(3), "b": np.ones(2)}
    e = sv.Gaussian(dd, noise_std={"a": [1.0, 2.0, 4.0], "b": 0.5}).energy({"a": jnp.zeros(3), "b": jnp.zeros(2)})
    np.testing.assert_allclose(float(e), 0.5 * (1 + 0.25 + 1 / 16 + 2 * 4.0), rtol=1e-14)
    # one array broadcasts to every leaf of tuple data
    e = sv.Gaussian((np.ones(2), np.ones(2)), noise_std=np.array([1.0, 0.5])).energy((jnp.zeros(2), jnp.zeros(2)))
    np.testing.assert_allclose(float(e), 2 * 0.5 * (1 + 4.0), rtol=1e-14)


def test_noise_std_near_the_overflow_limit_is_accepted():
    """The limit is 1/noise_std**2 finite in the data's dtype, not a fixed number."""
    for dtype, ok in ((np.float64, 1e-150), (np.float32, 1e-18)):
        lh = sv.Gaussian(DATA.astype(dtype), noise_std=ok)
        assert np.isfinite(float(lh.energy(jnp.zeros(N, dtype))))
        with pytest.raises(ValueError, match="noise_std.*overflows"):
            sv.Gaussian(DATA.astype(dtype), noise_std=ok / 1e10)


def test_devices_generator_is_read_once_and_one_device_strategies_take_their_device():
    """A generator of devices reaches both strategies; vmap with its own device is fine."""
    opt = sv.OptimizeVI(LH, 1, n_samples=1, sample_map="shard_map", kl_map="pmap", devices=_devices_gen())
    assert opt.sample_strategy.devices == opt.kl_strategy.devices == tuple(jax.devices()[:2])
    opt = sv.OptimizeVI(LH, 1, n_samples=1, sample_map="vmap", kl_map=sv.parallel.LaxMap(), devices=jax.devices()[:1])
    assert isinstance(opt.sample_strategy, sv.parallel.Vmap) and isinstance(opt.kl_strategy, sv.parallel.LaxMap)
    # a strategy object with devices= equal to its own is not an error
    shard = sv.parallel.ShardMap(devices=jax.devices()[:2])
    assert (
        sv.OptimizeVI(LH, 1, n_samples=1, sample_map=shard, kl_map=shard, devices=jax.devices()[:2]).sample_strategy
        is shard
    )


def test_matching_dtypes_amend_and_keep_their_dtype():
    """float32 data with a float32 model is accepted and stays float32."""
    lh = sv.Gaussian(DATA.astype(np.float32), noise_std=0.5).amend(sv.Model(jnp.exp, F32))
    e = lh.energy(jnp.zeros(N, jnp.float32))
    assert e.dtype == jnp.float32
    np.testing.assert_allclose(float(e), 0.0, atol=0)  # exp(0) = 1 = data


def test_samples_validation_leaves_jax_transformations_alone():
    """Samples checks its inputs, but pytree round trips (vmap axes, tree_map) are not checked."""
    smp = sv.Samples(POS, RES, jax.random.split(KEY, 1))
    assert len(smp) == 2 and len(sv.Samples(POS, RES, jax.random.split(KEY, 2))) == 2  # per pair or per sample
    axes = jax.tree_util.tree_map(lambda _: 0, smp)  # a Samples holding ints
    assert axes.pos == 0 and axes.keys == 0
    # built inside vmap from tracers (shapes are checked per batch member), and mapped with an in_axes spec
    means = jax.vmap(lambda r: sv.Samples(POS, r).mean())(jnp.arange(3.0)[:, None, None] * jnp.ones((3, 2, N)))
    np.testing.assert_array_equal(np.asarray(means), np.arange(3.0)[:, None] * np.ones((3, N)))
    spec = sv.Samples.tree_unflatten(None, (None, 0, None))  # an in_axes spec (the constructor validates)
    batch = sv.Samples.tree_unflatten(None, (POS, jnp.ones((3, 2, N)), None))
    assert jax.vmap(lambda s: s.pos + s.residuals[0], in_axes=(spec,))(batch).shape == (3, N)
    assert sv.Samples({"a": POS, "b": 0.0}, {"a": RES, "b": jnp.zeros(2)}).at({"a": POS, "b": 1.0}).pos["b"] == 1.0


def test_summed_likelihoods_must_read_shared_latents_in_one_dtype():
    d = np.linspace(-1.0, 1.0, N)
    a = sv.Gaussian(d, noise_std=0.5).amend(
        sv.Model(lambda x: x["s"] * x["xi"], {"xi": DOMAIN, "s": jax.ShapeDtypeStruct((), jnp.float64)})
    )
    b = sv.Gaussian(d, noise_std=0.5).amend(
        sv.Model(lambda x: x["s"].astype(jnp.float64) * jnp.ones(N), {"s": jax.ShapeDtypeStruct((), jnp.float32)})
    )
    for lhs, rhs in ((a, b), (b, a)):
        with pytest.raises(TypeError, match="dtype of domain entry 's'"):
            lhs + rhs
    with pytest.raises(TypeError, match="dtype of the domain"):
        sv.Gaussian(DATA, noise_std=0.5).amend(MODEL) + sv.Gaussian(DATA.astype(np.float32), noise_std=0.5).amend(
            sv.Model(jnp.exp, F32)
        )


def test_gaussian_noise_callables_are_traced_on_the_data_shapes_when_built():
    with pytest.raises(ValueError, match=r"noise_cov_inv must return .*\(4,\).*got .*\(3,\)"):
        sv.Gaussian(DATA, noise_cov_inv=lambda r: r[:3], noise_std_inv=lambda r: r)
    with pytest.raises(ValueError, match="noise_std_inv must return"):
        sv.Gaussian(DATA, noise_cov_inv=lambda r: r, noise_std_inv=lambda r: r.astype(jnp.float32))
    with pytest.raises(ValueError, match="noise_cov_inv failed .*ZeroDivisionError"):
        sv.Gaussian(DATA, noise_cov_inv=lambda r: 1 / 0, noise_std_inv=lambda r: r)
    with pytest.raises(ValueError, match="non-finite"):
        sv.Gaussian(DATA, noise_cov_inv=lambda r: r / 0.0, noise_std_inv=lambda r: r)


def test_gaussian_noise_arguments_that_do_not_go_together():
    with pytest.raises(ValueError, match="noise_std_inv goes with a callable noise_cov_inv.*noise_std"):
        sv.Gaussian(DATA, noise_std=1.0, noise_std_inv=lambda r: 10 * r)
    with pytest.raises(ValueError, match="noise_std_inv goes with a callable noise_cov_inv.*array noise_cov_inv"):
        sv.Gaussian(DATA, noise_cov_inv=2.0, noise_std_inv=lambda r: r)
    with pytest.raises(TypeError, match="noise_std_inv must be a callable"):
        sv.Gaussian(DATA, noise_cov_inv=lambda r: r, noise_std_inv=jnp.ones(N))
    with pytest.raises(ValueError, match=r"noise_cov_inv has shape \(4, 4\).*dense noise covariance pass callables"):
        sv.Gaussian(DATA, noise_cov_inv=jnp.eye(N))
    with pytest.raises(ValueError, match=r"noise_std has shape \(3,\)"):
        sv.Gaussian(DATA, noise_std=np.ones(3))


def test_wiener_filter_flags_must_be_bools():
    lin = sv.Gaussian(DATA, noise_std=0.5).amend(sv.Model(lambda x: 2.0 * x, DOMAIN))
    with pytest.raises(TypeError, match="check_linear must be a bool"):
        sv.wiener_filter_posterior(lin, key=KEY, n_samples=1, check_linear="yes")


def test_the_sign_of_a_geovi_update_is_plus_or_minus_one():
    r, _ = sv.draw_linear_residual(LH, POS + 0.1, KEY)
    for sign, exc, match in ((0.0, ValueError, "got 0.0"), (5, ValueError, "got 5"), ("+", TypeError, "got str")):
        with pytest.raises(exc, match=f"metric_sample_sign must be .*{match}"):
            sv.nonlinearly_update_residual(LH, POS + 0.1, r, KEY, sign)
    with pytest.raises(TypeError, match=r"metric_sample_sign must be a scalar.*\(1,\)"):
        sv.nonlinearly_update_residual(LH, POS + 0.1, r, KEY, jnp.ones(1))
    # +1 / -1 of any real type, and traced signs (mapped over the samples), are accepted: the mirror is -r's update
    plus = sv.nonlinearly_update_residual(LH, POS + 0.1, r, KEY, np.int32(1))[0]
    both = jax.vmap(lambda s, x: sv.nonlinearly_update_residual(LH, POS + 0.1, x, KEY, s)[0])(
        jnp.array([1.0, -1.0]), jnp.stack([r, -r])
    )
    np.testing.assert_allclose(both[0], plus, rtol=1e-12, atol=1e-12)


def test_a_sample_mask_has_one_bool_per_latent_leaf():
    pos = {"a": POS + 0.1, "b": jnp.asarray(0.2)}
    with pytest.raises(TypeError, match="sample_mask must hold one bool per latent leaf.*float"):
        sv.draw_linear_residual(DICT_LH, pos, KEY, sample_mask={"a": 1.5, "b": 0.0})
    with pytest.raises(ValueError, match="sample_mask must have the structure of the likelihood's domain"):
        sv.draw_linear_residual(DICT_LH, pos, KEY, sample_mask={"a": True})
    r, _ = sv.draw_linear_residual(DICT_LH, pos, KEY, sample_mask={"a": True, "b": np.bool_(False)})
    assert float(r["b"]) == 0.0 and np.all(np.asarray(r["a"]) != 0)


def test_public_sampling_functions_refuse_a_non_finite_position():
    with pytest.raises(ValueError, match="pos contains non-finite"):
        sv.draw_linear_residual(LH, jnp.array([jnp.nan, 0.1, 0.1, 0.1]), KEY)
    r, _ = sv.draw_linear_residual(LH, POS, KEY)
    with pytest.raises(ValueError, match="residual contains non-finite"):
        sv.nonlinearly_update_residual(LH, POS, r.at[0].set(jnp.inf), KEY, 1.0)


def test_conjugate_gradient_operands_must_match_the_right_hand_side():
    a = jnp.diag(jnp.arange(1.0, 5.0))
    with pytest.raises(ValueError, match=r"conjugate_gradient: x0 must have .*float64\[4\].*got .*float64\[5\]"):
        sv.minimizers.conjugate_gradient(lambda x: a @ x, jnp.ones(4), jnp.zeros(5), sv.CGConfig())
    with pytest.raises(ValueError, match=r"x0 must have .*float32\[4\]"):
        sv.minimizers.conjugate_gradient(lambda x: a @ x, jnp.ones(4), jnp.zeros(4, jnp.float32), sv.CGConfig())
    with pytest.raises(ValueError, match=r"conjugate_gradient: matvec\(v\) must have .*got .*float64\[3\]"):
        sv.minimizers.conjugate_gradient(lambda x: jnp.ones(3), jnp.ones(4), jnp.zeros(4), sv.CGConfig())
    res = sv.minimizers.conjugate_gradient(lambda x: a @ x, jnp.ones(4), None, sv.CGConfig(tol=1e-12))
    np.testing.assert_allclose(res.x, 1.0 / np.arange(1.0, 5.0), rtol=1e-10)


def test_plan_names_a_position_of_the_wrong_structure():
    with pytest.raises(ValueError, match="position has tree structure"):
        sv.parallel.plan(DICT_LH, {"a": POS}, n_samples=1)


def test_a_likelihood_built_from_traced_data_is_a_clear_error():
    with pytest.raises(TypeError, match="data is traced"):
        jax.jit(lambda d: sv.Gaussian(d, noise_std=1.0).energy(d))(jnp.ones(N))
    with pytest.raises(TypeError, match="counts is traced"):
        jax.vmap(lambda c: sv.Poisson(c).energy(c))(jnp.ones((2, N)))


def test_field_blocks_name_a_grid_latent_the_model_reads_directly():
    """A latent of the grid's shape reaches the model as blocks of rows, which only a correlated field reads."""
    mask = np.ones((8, 4), bool)
    mask[2:4, 1:3] = False
    resp = sv.Mask(mask)
    model = sv.Model(lambda x: resp(jnp.exp(x)), jax.ShapeDtypeStruct((8, 4), jnp.float64))
    lh = sv.Gaussian(jnp.ones(resp.size), noise_std=0.5).amend(model, field_blocks=2)
    with pytest.raises(ValueError, match=r"field_blocks: the latent leaves of the grid's shape .*exp requires"):
        sv.optimize_kl(
            lh,
            jnp.full((8, 4), 0.1),
            key=KEY,
            n_total_iterations=1,
            n_samples=1,
            sample_mode="linear_resample",
            progress=False,
        )


def test_responses_built_from_traced_pixels_are_a_clear_error():
    with pytest.raises(TypeError, match="Sampling: indices is traced"):
        jax.jit(lambda i: sv.Sampling((i,), (8,))(jnp.ones(8)))(jnp.array([0, 1]))
    with pytest.raises(TypeError, match="Mask: mask is traced"):
        jax.jit(lambda m: sv.Mask(m)(jnp.ones(8)))(jnp.ones(8, bool))
    mask = sv.Mask(np.arange(8) != 2)  # built outside, passed through jit as a pytree: fine
    np.testing.assert_array_equal(jax.jit(lambda r, x: r(x))(mask, jnp.arange(8.0)), [0, 1, 3, 4, 5, 6, 7])


def test_nufft_points_given_as_lists_are_arrays():
    r = sv.NUFFTResponse([1.0, 2.0], [1.0, 3.0], (4, 4), 0.01)
    image = jnp.ones((4, 4))
    np.testing.assert_array_equal(r(image, {"u": [1.0, 2.0], "v": [1.0, 3.0]}), r(image))
    with pytest.raises(TypeError, match="u must be a real array"):
        sv.NUFFTResponse(["a"], [1.0], (4, 4), 0.01)


def test_field_array_casts_only_where_the_values_survive():
    strat = sv.parallel.ShardMap(devices=jax.devices()[:4], model_shards=2)

    def fill(value):
        return lambda rows: np.full((rows.stop - rows.start, 4), value)

    with pytest.raises(ValueError, match="int64 do not fit in int32"):
        sv.parallel.field_array(strat, (8, 4), fill(2**40), dtype=np.int32)
    with pytest.raises(TypeError, match="complex128 cannot become float64"):
        sv.parallel.field_array(strat, (8, 4), fill(1 + 2j), dtype=np.float64)
    with pytest.raises(ValueError, match="float64 do not fit in float32"):
        sv.parallel.field_array(strat, (8, 4), fill(1e300), dtype=np.float32)
    a = sv.parallel.field_array(strat, (8, 4), fill(7), dtype=np.float32)
    assert a.dtype == np.float32 and np.all(np.asarray(a) == 7)
