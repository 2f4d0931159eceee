"""The layout a likelihood carries: what is cut, what a device holds, the operators the engine asks it for."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi.parallel import ShardMap
from shardvi.vi.blocked import DataBlocks
from shardvi.vi.field_split import FieldRows
from shardvi.vi.layout import WHOLE, Layout, Whole

N = 8


def _grid_problem():
    """A 2-D log-normal field (excitations on the grid and one scalar) with data at every pixel."""
    domain = {"xi": jax.ShapeDtypeStruct((N, N), jnp.float64), "scale": jax.ShapeDtypeStruct((), jnp.float64)}
    model = sv.Model(lambda x: jnp.exp(0.3 * x["scale"] + 0.5 * x["xi"]), domain)
    d = np.exp(0.5 * np.random.default_rng(0).normal(size=(N, N)))
    return model, d


def _data_problem(n=12):
    x = np.linspace(0.0, 1.0, n)
    domain = jax.ShapeDtypeStruct((3,), jnp.float64)
    model = sv.Model(lambda p, t: p[0] + p[1] * t + p[2] * t**2, domain, data_inputs=x)
    d = 1.0 + 2.0 * x - x**2 + 0.1 * np.random.default_rng(1).normal(size=n)
    return model, d


def test_every_likelihood_carries_its_layout():
    model, d = _grid_problem()
    lh = sv.Gaussian(d, noise_std=0.1)
    assert lh.layout == WHOLE and lh.amend(model).layout == WHOLE and (lh + lh).layout == WHOLE
    split = lh.amend(model, field_blocks=4)
    assert split.layout == FieldRows(4, frozenset({(N, N)}))
    assert split.layout.splits_latent and not split.layout.splits_data and split.layout.model_blocks == 4
    assert split.layout.latent_split(model.domain) == {"xi": True, "scale": False}
    dmodel, dd = _data_problem()
    blocked = sv.Gaussian(dd, noise_std=0.1).amend(dmodel, data_blocks=5)  # 12 data: the last block padded
    assert blocked.layout == DataBlocks(5) and blocked.layout.splits_data and blocked.layout.model_blocks == 5
    assert WHOLE.model_blocks is None and WHOLE.latent_split(model.domain) == {"xi": False, "scale": False}
    # the likelihood of the data alone, whatever the layout (the Wiener filter's linear-Gaussian check asks it)
    assert lh.data_likelihood is None and (lh + lh).amend(model).data_likelihood.__class__.__name__ == "SumLikelihood"
    assert lh.amend(model).data_likelihood is lh and split.data_likelihood.__class__ is sv.Gaussian
    assert isinstance(blocked.data_likelihood, sv.Gaussian)
    assert np.shape(blocked.data_likelihood.data) == (15,)  # 12 data, padded to 5 blocks of 3


def test_a_device_holds_its_rows_of_the_grid_leaves_only():
    model, _ = _grid_problem()
    grid_bytes, scalar_bytes = N * N * 8, 8
    assert WHOLE.latent_bytes_per_device(model.domain, 4) == grid_bytes + scalar_bytes
    assert DataBlocks(4).latent_bytes_per_device(model.domain, 4) == grid_bytes + scalar_bytes
    rows = FieldRows(4, frozenset({(N, N)}))
    assert rows.latent_bytes_per_device(model.domain, 4) == grid_bytes // 4 + scalar_bytes
    assert rows.latent_bytes_per_device(model.domain, 1) == grid_bytes + scalar_bytes


def test_model_shards_must_divide_the_blocks_of_either_layout():
    DataBlocks(6).check_model_shards(3)
    WHOLE.check_model_shards(3)  # nothing to split: the model axis replicates
    with pytest.raises(ValueError, match=r"model_shards=4 does not divide data_blocks=6: .* whole data blocks"):
        DataBlocks(6).check_model_shards(4)
    with pytest.raises(ValueError, match=r"model_shards=3 does not divide field_blocks=4: .* grid rows"):
        FieldRows(4).check_model_shards(3)


def test_entry_points_that_do_not_take_a_field_split_say_so_before_any_work():
    model, d = _grid_problem()
    split = sv.Gaussian(d, noise_std=0.1).amend(model, field_blocks=4)
    with pytest.raises(NotImplementedError, match="wiener_filter_posterior does not take .* field_blocks"):
        sv.wiener_filter_posterior(split, key=jax.random.PRNGKey(0), n_samples=1)
    with pytest.raises(TypeError, match="data_blocks or field_blocks cannot be added"):
        split + sv.Gaussian(d, noise_std=0.1).amend(model)


@dataclasses.dataclass(frozen=True)
class _ClosedFormLayout(Whole):
    """A new layout in a few lines: the Hamiltonian of ``Gaussian(d, 1).amend(identity)`` and its gradient in
    closed form, ``H = |xi - d|^2 / 2 + |xi|^2 / 2``."""

    name: ClassVar[str] = "closed form"
    used: ClassVar[list] = []

    def hamiltonian_and_grad(self, likelihood, xi):
        type(self).used.append(True)
        d = likelihood.likelihood.data
        return 0.5 * jnp.sum((xi - d) ** 2) + 0.5 * jnp.sum(xi**2), 2.0 * xi - d


class _ClosedFormLikelihood(sv.vi.likelihood.AmendedLikelihood):
    @property
    def layout(self):
        return _ClosedFormLayout()


def test_the_engine_computes_the_hamiltonian_as_the_layout_says():
    d = np.array([1.0, -2.0, 0.5, 3.0])
    model = sv.Model(lambda x: x, jax.ShapeDtypeStruct((4,), jnp.float64))
    plain = sv.Gaussian(d, noise_std=1.0).amend(model)
    custom = _ClosedFormLikelihood(sv.Gaussian(d, noise_std=1.0), model)
    kw = dict(key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=0, sample_mode="linear_resample")
    kw |= dict(progress=False)
    kw |= dict(kl_minimization=sv.NewtonCGConfig(xtol=1e-12, maxiter=20))
    _ClosedFormLayout.used.clear()
    got, _ = sv.optimize_kl(custom, jnp.zeros(4), **kw)
    assert _ClosedFormLayout.used  # the KL step asked the layout
    want, _ = sv.optimize_kl(plain, jnp.zeros(4), **kw)
    np.testing.assert_allclose(got.pos, d / 2, rtol=1e-12)  # the posterior mean of this linear problem
    np.testing.assert_allclose(got.pos, want.pos, rtol=1e-12)


def test_the_strategy_checks_the_layouts_it_places():
    model, d = _grid_problem()
    split = sv.Gaussian(d, noise_std=0.1).amend(model, field_blocks=2)
    strategy = ShardMap(devices=jax.devices()[:4], model_shards=4)
    with pytest.raises(ValueError, match="model_shards=4 does not divide field_blocks=2"):
        strategy.check_blocks(split)
    assert isinstance(split.layout, Layout)


def test_model_sum_is_the_sum_over_the_parts_of_the_signal():
    """``layout.model_sum``: per-part terms of the model's signal, summed as the layout sums; for data blocks the
    squared norm of the signal over all blocks (and a padded last block: 10 data in 4 blocks) is the whole one's."""
    model, d = _data_problem(n=10)
    xi = jnp.asarray([0.3, -1.2, 0.7])

    def sq(signal, x):
        return jnp.sum(signal(x) ** 2)

    want = float(np.sum(np.asarray(model(xi)) ** 2))
    whole = sv.Gaussian(d, noise_std=0.1).amend(model)
    assert float(whole.layout.model_sum(whole, sq, xi)) == pytest.approx(want, rel=1e-14)
    for blocks in (2, 4):
        blocked = sv.Gaussian(d, noise_std=0.1).amend(model, data_blocks=blocks)
        got = float(jax.jit(lambda x, lh=blocked: lh.layout.model_sum(lh, sq, x))(xi))
        assert got == pytest.approx(want, rel=1e-14), blocks
