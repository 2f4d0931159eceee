"""The model-parallel test problems (tests/test_model_parallel.py, tests/_distributed_worker.py,
tests/test_wiener_posterior.py); not a test module."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import Partial

import shardvi as sv

N_PIX, N_LAT, N_DATA = 24, 16, 96


def linear_blocked_problem():
    """``s_i = row_i . xi`` (6 latents) with per-datum rows as ``data_inputs``, 40 data in 4 blocks, heteroscedastic
    Gaussian noise: ``(lh, D, m)`` with the exact posterior covariance ``D`` and mean ``m``."""
    rng = np.random.default_rng(3)
    n_lat, n = 6, 40
    rows = rng.normal(size=(n, n_lat))
    std = 0.3 + 0.2 * rng.random(n)
    d = rows @ rng.normal(size=n_lat) + std * rng.normal(size=n)
    domain = {"x": jax.ShapeDtypeStruct((n_lat,), jnp.float64)}
    model = sv.Model(lambda xi, inp: inp["row"] @ xi["x"], domain, data_inputs={"row": rows})
    lh = sv.Gaussian(d, noise_std=std).amend(model, data_blocks=4)
    D = np.linalg.inv(np.eye(n_lat) + rows.T @ (rows / std[:, None] ** 2))
    return lh, D, D @ (rows.T @ (d / std**2))


def _pixel_call(a, xi, inputs):
    """A nonlinear field on 24^2 pixels from 16 latents, read at the data's pixel indices."""
    return jnp.exp(0.3 * (a @ xi["x"]))[inputs["pix"]]


@functools.cache
def _masked_arrays(noise=0.1):
    """``(a, pix, d, std)``: the field's matrix, the observed pixels, the data and their noise."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(N_PIX * N_PIX, N_LAT)) / 4.0
    pix = rng.choice(N_PIX * N_PIX, size=N_DATA, replace=False).astype(np.int32)
    model = _masked_model(a, pix)
    truth = model.init(jax.random.PRNGKey(1))
    d = np.asarray(model(truth)) + noise * rng.normal(size=N_DATA)
    std = noise * (1 + 0.5 * rng.random(N_DATA))
    return a, pix, d, std


def _masked_model(a, pix):
    domain = {"x": jax.ShapeDtypeStruct((N_LAT,), jnp.float64)}
    return sv.Model(Partial(_pixel_call, jnp.asarray(a)), domain, data_inputs={"pix": pix})


@functools.cache
def masked_problem(data_blocks=4):
    """Pixel-wise data of a nonlinear field at 96 of 576 pixels (no FFT: every strategy partitions it)."""
    a, pix, d, std = _masked_arrays()
    model = _masked_model(a, pix)
    full = sv.Gaussian(d, noise_std=std).amend(model)
    blocked = sv.Gaussian(d, noise_std=std).amend(model, data_blocks=data_blocks)
    return model, full, blocked


def masked_local_blocks(first: int, count: int, data_blocks=4):
    """The likelihood of blocks ``[first, first + count)`` of :func:`masked_problem` only (one process's data)."""
    a, pix, d, std = _masked_arrays()
    size = N_DATA // data_blocks
    sl = slice(first * size, (first + count) * size)
    return sv.Gaussian(d[sl], noise_std=std[sl]).amend(_masked_model(a, pix[sl]), data_blocks=count)


def _observe(resp, xi, inputs):
    return resp(jnp.exp(0.5 * xi["img"]), inputs)


@functools.cache
def radio_problem(data_blocks=4):
    """Visibilities (NUFFT) of an 8x8 log-normal image, 96 baselines, complex Gaussian noise."""
    rng = np.random.default_rng(1)
    npix, m, dl = 8, 96, 1e-5
    u, v = rng.uniform(-0.4 / dl, 0.4 / dl, (2, m))
    resp = sv.NUFFTResponse(u, v, (npix, npix), dl, eps=1e-10, dtype=np.float64)
    domain = {"img": jax.ShapeDtypeStruct((npix, npix), jnp.float64)}
    model = sv.Model(Partial(_observe, resp.without_points()), domain, data_inputs=resp.data_inputs)
    vis = np.asarray(model(model.init(jax.random.PRNGKey(2))))
    sig = 0.1 * float(np.sqrt(np.mean(np.abs(vis) ** 2)))
    d = vis + sig * (rng.normal(size=m) + 1j * rng.normal(size=m))
    full = sv.Gaussian(d, noise_std=sig).amend(model)
    return model, full, sv.Gaussian(d, noise_std=sig).amend(model, data_blocks=data_blocks)


def run_layout(lh, pos, strategy, **kw):
    """One MGVI + geoVI + KL iteration with ``strategy`` for both maps: (arrays, KL energies, state).

    The models here are row-local: the row-locality check before the first iteration (tested in
    ``test_field_split.py``) is skipped, so each layout compiles only the engine's steps."""
    kw.setdefault("check_field_split", False)
    samples, state = sv.optimize_kl(
        lh,
        pos,
        key=jax.random.PRNGKey(0),
        n_total_iterations=1,
        n_samples=2,
        sample_mode="nonlinear_resample",  # MGVI draws, their geoVI update and the KL minimization
        nonlinear_update=sv.NewtonCGConfig(xtol=0, maxiter=2),
        kl_minimization=sv.NewtonCGConfig(xtol=0, maxiter=2),
        sample_map=strategy,
        kl_map=strategy,
        progress=False,
        **kw,
    )
    return jax.tree.leaves((samples.pos, samples.residuals)), [h.kl_energy for h in state.history], state


@functools.cache
def one_device_run(problem_name: str = "masked", level: int | None = None):
    """:func:`run_layout` of a problem on one device (``Vmap``), cached per test process: the reference of the
    layout comparisons (``level``: the LLVM level of the engine's steps, ``None`` for the engine's default)."""
    from shardvi.parallel import Vmap

    model, _, blocked = {"masked": masked_problem, "radio": radio_problem}[problem_name]()
    kw = {} if level is None else {"compiler_options": {"xla_backend_optimization_level": level}}
    return run_layout(blocked, start_position(model), Vmap(), **kw)


def start_position(model):
    """The start of the layout comparisons."""
    return jax.tree.map(lambda v: 0.1 * v, model.init(jax.random.PRNGKey(5)))
