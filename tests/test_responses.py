"""Responses: Mask, Sampling and the radio NUFFT (vs a dense DFT), under jit/vmap/AD/shard_map."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from shardvi.models import Mask, NUFFTResponse, Sampling, match_vma, nufft2d_type1, nufft2d_type2

SHAPE = (12, 9)  # even x odd, non-square: exercises the centring convention
PIX = (2.0e-5, 3.0e-5)  # radians
M = 48  # divisible by 4 devices


def rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def dense_matrix(u, v, shape, pix):
    """A[j, (p, q)] = exp(-2 pi i (u_j l_p + v_j m_q)), l_p = (p - nx//2) dl (numpy, float64)."""
    l_p = (np.arange(shape[0]) - shape[0] // 2) * pix[0]
    m_q = (np.arange(shape[1]) - shape[1] // 2) * pix[1]
    ph = u[:, None, None] * l_p[None, :, None] + v[:, None, None] * m_q[None, None, :]
    return np.exp(-2j * np.pi * ph).reshape(len(u), -1)


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(1)
    # |u dl| up to 0.7 > 0.5: beyond Nyquist, checks the exact periodic wrap of the points
    u = rng.uniform(-0.7, 0.7, M) / PIX[0]
    v = rng.uniform(-0.7, 0.7, M) / PIX[1]
    img = rng.normal(size=SHAPE)
    d = rng.normal(size=M) + 1j * rng.normal(size=M)
    return dict(u=u, v=v, img=img, d=d, A=dense_matrix(u, v, SHAPE, PIX), R=NUFFTResponse(u, v, SHAPE, PIX, eps=1e-12))


def loss_fn(R, d):
    return lambda img: 0.5 * jnp.sum(jnp.abs(R(img) - d) ** 2)


# ----------------------------------------------------------------------------- Mask / Sampling
def test_mask_forward_adjoint_dot(key):
    rng = np.random.default_rng(0)
    mask = rng.random((7, 5)) < 0.6
    R = Mask(mask)
    x = rng.normal(size=(7, 5))
    y = rng.normal(size=R.size)
    np.testing.assert_array_equal(R(x), x[mask])
    back = np.asarray(R.adjoint(y))
    np.testing.assert_array_equal(back[~mask], 0.0)
    np.testing.assert_array_equal(back[mask], y)
    assert abs(np.dot(R(x), y) - np.sum(x * back)) <= 1e-13 * np.abs(x).sum() * np.abs(y).max()
    # jit, vmap and the VJP equal the explicit adjoint
    np.testing.assert_array_equal(jax.jit(R)(x), x[mask])
    xs = rng.normal(size=(3, 7, 5))
    np.testing.assert_array_equal(jax.vmap(R)(xs), np.stack([xi[mask] for xi in xs]))
    np.testing.assert_array_equal(jax.vjp(R, jnp.asarray(x))[1](jnp.asarray(y))[0], back)


def test_sampling_dot_with_repeats():
    rng = np.random.default_rng(0)
    shape = (6, 4)
    idx = (np.array([0, 5, 2, 2, 0]), np.array([1, 3, 0, 0, 1]))  # repeats must add up
    R = Sampling(idx, shape)
    x = rng.normal(size=shape)
    y = rng.normal(size=5)
    np.testing.assert_array_equal(R(x), x[idx])
    back = np.asarray(R.adjoint(y))
    assert back[0, 1] == pytest.approx(y[0] + y[4]) and back[2, 0] == pytest.approx(y[2] + y[3])
    assert np.dot(R(x), y) == pytest.approx(np.sum(x * back), rel=1e-13)
    np.testing.assert_allclose(jax.vjp(R, jnp.asarray(x))[1](jnp.asarray(y))[0], back, rtol=1e-15)
    # a mask is a sampling at np.nonzero(mask)
    mask = rng.random(shape) < 0.5
    np.testing.assert_array_equal(Sampling(np.nonzero(mask), shape)(x), Mask(mask)(x))


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: Mask(np.ones((3, 3))), "mask"),
        (lambda: Mask(np.bool_(True)), "mask"),
        (lambda: Mask(np.ones((3, 3), bool))(np.ones((3, 4))), "field"),
        (lambda: Mask(np.ones((3, 3), bool)).adjoint(np.ones(8)), "data"),
        (lambda: Sampling((np.array([0, 3]),), (3,)), "indices"),
        (lambda: Sampling((np.array([0]),), (3, 3)), "indices"),
        (lambda: Sampling((np.array([0.5]),), (3,)), "indices"),
        (lambda: Sampling((np.array([0]),), (0,)), "shape"),
    ],
)
def test_mask_sampling_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


# ----------------------------------------------------------------------------- NUFFT accuracy
def test_nufft_forward_vs_dense_dft_float64(setup):
    s = setup
    err = rel(s["R"](jnp.asarray(s["img"])), s["A"] @ s["img"].ravel())
    assert err <= 1e-10, err
    # the defaults (eps=1e-9) are ~1e-9 accurate
    R9 = NUFFTResponse(s["u"], s["v"], SHAPE, PIX)
    assert rel(R9(jnp.asarray(s["img"])), s["A"] @ s["img"].ravel()) <= 1e-8


def test_nufft_forward_and_adjoint_float32(setup):
    s = setup
    R = NUFFTResponse(s["u"], s["v"], SHAPE, PIX, eps=1e-6, dtype=np.float32)
    vis = R(jnp.asarray(s["img"], jnp.float32))
    assert vis.dtype == jnp.complex64
    assert rel(vis, s["A"] @ s["img"].ravel()) <= 2e-5
    dirty = R.adjoint(jnp.asarray(s["d"], jnp.complex64))
    assert dirty.dtype == jnp.float32
    assert rel(dirty, np.real(s["A"].conj().T @ s["d"]).reshape(SHAPE)) <= 2e-5


def test_nufft_adjoint_vs_dense_and_dot_test(setup):
    s = setup
    R, img, d = s["R"], jnp.asarray(s["img"]), jnp.asarray(s["d"])
    dirty = R.adjoint(d)
    assert rel(dirty, np.real(s["A"].conj().T @ s["d"]).reshape(SHAPE)) <= 1e-10
    lhs = float(jnp.real(jnp.vdot(R(img), d)))  # <R x, y> = Re sum conj(Rx) y
    rhs = float(jnp.sum(img * dirty))  # <x, R^T y>
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs), (lhs, rhs)


def test_low_level_transforms_are_transposes(setup):
    s = setup
    rng = np.random.default_rng(3)
    x, y = jnp.asarray(rng.uniform(-7, 7, M)), jnp.asarray(rng.uniform(-7, 7, M))
    f = jnp.asarray(rng.normal(size=SHAPE) + 1j * rng.normal(size=SHAPE))
    c = jnp.asarray(s["d"])
    for iflag in (-1, 1):
        a = jnp.sum(nufft2d_type2(f, x, y, iflag=iflag, eps=1e-13) * c)
        b = jnp.sum(f * nufft2d_type1(c, x, y, SHAPE, iflag=iflag, eps=1e-13))
        assert abs(a - b) <= 1e-12 * abs(a)


# ----------------------------------------------------------------------------- AD / vmap / jit
@pytest.mark.slow
def test_nufft_gradient_vs_dense_and_finite_differences(setup):
    s = setup
    R, img, d, A = s["R"], jnp.asarray(s["img"]), jnp.asarray(s["d"]), s["A"]
    loss = loss_fn(R, d)
    g = jax.jit(jax.grad(loss))(img)
    g_dense = np.real(A.conj().T @ (A @ s["img"].ravel() - s["d"])).reshape(SHAPE)
    assert rel(g, g_dense) <= 1e-10

    def dense_loss(x):
        return 0.5 * jnp.sum(jnp.abs(jnp.asarray(A) @ x.ravel() - d) ** 2)

    assert rel(g, jax.grad(dense_loss)(img)) <= 1e-10
    rng = np.random.default_rng(4)
    h = 1e-5
    for _ in range(3):
        t = jnp.asarray(rng.normal(size=SHAPE))
        fd = (loss(img + h * t) - loss(img - h * t)) / (2 * h)
        assert abs(fd - jnp.sum(g * t)) <= 1e-7 * abs(fd)


def test_nufft_jvp_vjp_consistency(setup):
    s = setup
    R, img = s["R"], jnp.asarray(s["img"])
    rng = np.random.default_rng(5)
    t = jnp.asarray(rng.normal(size=SHAPE))
    w = jnp.asarray(rng.normal(size=M) + 1j * rng.normal(size=M))
    out, jt = jax.jvp(R, (img,), (t,))
    assert rel(jt, R(t)) <= 1e-13  # linear: J t = R t
    _, vjp = jax.vjp(R, img)
    (jtw,) = vjp(w)
    # JAX's pairing on complex outputs is Re sum(w * J t) (no conjugate)
    lhs, rhs = float(jnp.real(jnp.sum(w * jt))), float(jnp.sum(jtw * t))
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)
    # ... and the vjp is the adjoint of conj(w)
    assert rel(jtw, R.adjoint(jnp.conj(w))) <= 1e-13
    # forward-over-reverse (Hessian-vector product) of the quadratic loss: R^T R t
    hvp = jax.jvp(jax.grad(loss_fn(R, jnp.asarray(s["d"]))), (img,), (t,))[1]
    assert rel(hvp, R.adjoint(R(t))) <= 1e-12


@pytest.mark.slow
def test_nufft_vmap_matches_loop(setup):
    s = setup
    R, d = s["R"], jnp.asarray(s["d"])
    rng = np.random.default_rng(6)
    imgs = jnp.asarray(rng.normal(size=(3,) + SHAPE))
    loop = jnp.stack([R(x) for x in imgs])
    assert rel(jax.vmap(R)(imgs), loop) <= 1e-13
    assert rel(jax.jit(jax.vmap(R))(imgs), loop) <= 1e-13
    vs = jnp.stack([d, 2 * d, -d])
    assert rel(jax.vmap(R.adjoint)(vs), jnp.stack([R.adjoint(v) for v in vs])) <= 1e-13
    grads = jax.vmap(jax.grad(loss_fn(R, d)))(imgs)
    assert rel(grads, jnp.stack([jax.grad(loss_fn(R, d))(x) for x in imgs])) <= 1e-13
    # nested vmap, and a batch of uv coverages (the response is a pytree of u, v)
    assert rel(jax.vmap(jax.vmap(R))(imgs[None]), loop[None]) <= 1e-13
    Rs = jax.tree_util.tree_map(lambda a: jnp.stack([a, -a]), R)
    both = jax.vmap(lambda r, x: r(x))(Rs, imgs[:2])
    R_neg = NUFFTResponse(-s["u"], -s["v"], SHAPE, PIX, eps=1e-12)
    assert rel(both, jnp.stack([R(imgs[0]), R_neg(imgs[1])])) <= 1e-13


def test_nufft_response_is_a_jit_argument(setup):
    s = setup
    img = jnp.asarray(s["img"])
    out = jax.jit(lambda r, x: r(x))(s["R"], img)
    assert rel(out, s["R"](img)) <= 1e-13
    leaves = jax.tree_util.tree_leaves(s["R"])
    assert len(leaves) == 2 and leaves[0].shape == (M,)


# ----------------------------------------------------------------------------- shard_map
@pytest.mark.parametrize("n_dev", [1, 4])
@pytest.mark.parametrize("check_vma", [True, False])
def test_nufft_shard_map_forward_and_gradient(setup, n_dev, check_vma):
    s = setup
    R, img, d = s["R"], jnp.asarray(s["img"]), jnp.asarray(s["d"])
    mesh = jax.make_mesh((n_dev,), ("s",), axis_types=(AxisType.Auto,))
    vis_ref, g_ref = R(img), jax.grad(loss_fn(R, d))(img)

    fwd = jax.shard_map(lambda r, x: r(x), mesh=mesh, in_specs=(P("s"), P()), out_specs=P("s"), check_vma=check_vma)
    assert rel(jax.jit(fwd)(R, img), vis_ref) <= 1e-12

    def local_loss(r, x, dd):  # visibilities sharded, image replicated
        return jax.lax.psum(loss_fn(r, dd)(x), "s")

    total = jax.shard_map(local_loss, mesh=mesh, in_specs=(P("s"), P(), P("s")), out_specs=P(), check_vma=check_vma)
    assert abs(jax.jit(total)(R, img, d) - loss_fn(R, d)(img)) <= 1e-12 * abs(loss_fn(R, d)(img))
    g = jax.jit(jax.grad(total, argnums=1))(R, img, d)  # gradient through shard_map
    assert rel(g, g_ref) <= 1e-12

    if check_vma:  # gradient taken inside shard_map w.r.t. the replicated image
        inner = jax.shard_map(
            lambda r, x, dd: jax.grad(lambda z: local_loss(r, z, dd))(x),
            mesh=mesh,
            in_specs=(P("s"), P(), P("s")),
            out_specs=P(),
        )
        assert rel(jax.jit(inner)(R, img, d), g_ref) <= 1e-12
        # adjoint: per-shard dirty images summed over devices
        adj = jax.shard_map(
            lambda r, v: jax.lax.psum(r.adjoint(v), "s"), mesh=mesh, in_specs=(P("s"), P("s")), out_specs=P()
        )
        assert rel(jax.jit(adj)(R, d), R.adjoint(d)) <= 1e-12


def test_match_vma_is_identity_outside_shard_map():
    a, b = jnp.ones(3), jnp.zeros(2)
    out = match_vma(a, b)
    assert out[0] is a and out[1] is b


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(u=np.ones(4), v=np.ones(5)), ValueError, "u and v"),
        (dict(u=np.ones((2, 2)), v=np.ones((2, 2))), ValueError, "u must be 1-D"),
        (dict(u=np.ones(4) + 1j, v=np.ones(4)), TypeError, "u must be a real"),
        (dict(u=np.array([1.0, np.nan]), v=np.ones(2)), ValueError, "finite"),
        (dict(eps=0.0), ValueError, "eps"),
        (dict(eps=-1e-6), ValueError, "eps"),
        (dict(eps=1.0), ValueError, "eps"),
        (dict(eps="1e-6"), TypeError, "eps"),
        (dict(dtype=np.int32), TypeError, "dtype"),
        (dict(pixel_size=0.0), ValueError, "pixel_size"),
        (dict(pixel_size=(1e-5, 1e-5, 1e-5)), ValueError, "pixel_size"),
        (dict(image_shape=(4,)), ValueError, "image_shape"),
        (dict(image_shape=(4, 0)), ValueError, "image_shape"),
    ],
)
def test_nufft_response_bad_construction(kwargs, exc, match):
    args = dict(u=np.ones(4), v=np.ones(4), image_shape=(4, 4), pixel_size=1e-5)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        NUFFTResponse(**args)


def test_nufft_bad_call_inputs(setup):
    R = setup["R"]
    with pytest.raises(ValueError, match="image must be 2-D"):
        R(jnp.ones(SHAPE[0] * SHAPE[1]))
    with pytest.raises(ValueError, match="image has shape"):
        R(jnp.ones((SHAPE[0], SHAPE[1] + 1)))
    with pytest.raises(TypeError, match="image has dtype float32"):
        R(jnp.ones(SHAPE, jnp.float32))
    with pytest.raises(TypeError, match="image has dtype complex128"):
        R(jnp.ones(SHAPE, jnp.complex128))
    with pytest.raises(TypeError, match="vis has dtype complex64"):
        R.adjoint(jnp.ones(M, jnp.complex64))
    with pytest.raises(ValueError, match="vis has shape"):
        R.adjoint(jnp.ones(M + 1, jnp.complex128))
    # low level: mixed precision would be a bare AssertionError inside jax-finufft
    f = jnp.ones((4, 4), jnp.complex128)
    with pytest.raises(TypeError, match="x has dtype float32"):
        nufft2d_type2(f, jnp.ones(3, jnp.float32), jnp.ones(3, jnp.float32))
    with pytest.raises(TypeError, match="f must be complex"):
        nufft2d_type2(jnp.ones((4, 4)), jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match="x and y"):
        nufft2d_type2(f, jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError, match="eps"):
        nufft2d_type2(f, jnp.ones(3), jnp.ones(3), eps=0)
    with pytest.raises(ValueError, match="iflag"):
        nufft2d_type2(f, jnp.ones(3), jnp.ones(3), iflag=2)
    with pytest.raises(ValueError, match="c has shape"):
        nufft2d_type1(jnp.ones(4, jnp.complex128), jnp.ones(3), jnp.ones(3), (4, 4))
    with pytest.raises(ValueError, match="shape"):
        nufft2d_type1(jnp.ones(3, jnp.complex128), jnp.ones(3), jnp.ones(3), (4, -1))
