"""The :class:`shardvi.parallel.Strategy` base and the strategy registry.

A new strategy is one class with one method (``map``); the registry feeds
``get_strategy`` (``sample_map="name"``), the CLI and the demos.
"""

import dataclasses
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi.__main__ import main
from shardvi.parallel import Strategy, Vmap, chunked_apply, get_strategy, register_strategy, strategy_names
from shardvi.parallel import strategy as strategy_module

pytestmark = pytest.mark.product_compiler  # a new strategy bitwise equal to Vmap (tests/conftest.py)

N = 4


@dataclasses.dataclass(frozen=True)
class Reversed(Strategy):
    """Evaluates the samples last to first, each alone (a chunk of one sample), and returns them in order.

    Keeps the bitwise contract: every sample sits at position 0 of a chunk of
    exactly one sample, the outputs come back in sample order, and the base's
    ``mean`` is the fixed-order mean over all of them.
    """

    name: str = "reversed"

    def map(self, fn, in_axes):
        def mapped(*args):
            flipped = tuple(jax.tree.map(lambda x: x[::-1], a) if ax == 0 else a for a, ax in zip(args, in_axes))
            return jax.tree.map(lambda y: y[::-1], chunked_apply(fn, in_axes, flipped, 1))

        return mapped


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry for one test (registrations do not leak into other tests)."""
    monkeypatch.setattr(strategy_module, "_REGISTRY", dict(strategy_module._REGISTRY))


def _linear_problem():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, N))
    data = a @ rng.normal(size=N) + 0.5 * rng.normal(size=6)
    domain = jax.ShapeDtypeStruct((N,), jnp.float64)
    return sv.Gaussian(data, noise_std=0.5).amend(sv.Model(lambda x: jnp.asarray(a) @ x, domain))


def _run(strategy):
    samples, state = sv.optimize_kl(
        _linear_problem(),
        jnp.zeros(N),
        key=jax.random.PRNGKey(3),
        n_total_iterations=2,
        n_samples=3,
        sample_mode="linear_resample",
        sample_map=strategy,
        kl_map=strategy,
        linear_sampling=sv.CGConfig(tol=1e-10, maxiter=50),
        kl_minimization=sv.NewtonCGConfig(xtol=1e-10, maxiter=5),
    )
    return np.asarray(samples.pos), np.asarray(samples.residuals), [r.kl_energy for r in state.history]


@pytest.mark.slow
def test_a_new_strategy_is_one_class_and_bitwise_equal_to_vmap(registry):
    """A subclass defining only ``map`` runs optimize_kl (by object and by name) bitwise equal to Vmap()."""
    ref = _run(Vmap())
    register_strategy("reversed", Reversed)
    for strategy in (Reversed(), "reversed"):
        pos, res, energies = _run(strategy)
        assert np.array_equal(pos, ref[0]) and np.array_equal(res, ref[1]) and energies == ref[2]
    assert len(ref[1]) == 6 and not np.array_equal(ref[1][0], ref[1][1])


def test_the_base_requires_map_and_supplies_the_rest():
    class NoMap(Strategy):
        pass

    with pytest.raises(TypeError, match="abstract method.*map"):
        NoMap()
    s = Reversed()
    x = jnp.arange(12.0).reshape(4, 3)
    assert s.place(x) is x and s.devices is None and s.reduce == "fixed"
    np.testing.assert_array_equal(sv.parallel.map_mean(s, lambda v: 2 * v, (0,))(x), 2 * x.mean(0))
    np.testing.assert_array_equal(s.map(lambda v: v * v, (0,))(x), x * x)


def test_psum_mode_uses_the_fast_hook_only():
    """``map_mean`` is ``mean(map)`` for reduce="fixed"; reduce="psum" goes through ``fast_map_mean``."""

    @dataclasses.dataclass(frozen=True)
    class Hooked(Reversed):
        reduce: str = "fixed"

        def fast_map_mean(self, fn, in_axes):
            return lambda *args: "fast"

    x = jnp.ones((3, 2))
    assert Hooked(reduce="psum").map_mean(lambda v: v, (0,))(x) == "fast"
    np.testing.assert_array_equal(Hooked().map_mean(lambda v: v, (0,))(x), jnp.ones(2))


def test_register_strategy_rejects_what_is_not_a_strategy_class(registry):
    with pytest.raises(TypeError, match="cls must be a subclass of shardvi.parallel.Strategy"):
        register_strategy("vmap2", lambda devices=None: Vmap())
    with pytest.raises(TypeError, match="cls must be a subclass"):
        register_strategy("vmap2", Vmap())
    with pytest.raises(TypeError, match="name must be a non-empty str"):
        register_strategy("", Vmap)


def test_registry_feeds_get_strategy_cli_and_demos(registry, capsys):
    register_strategy("reversed", Reversed)
    assert "reversed" in strategy_names() and set(sv.parallel.STRATEGY_NAMES) < set(strategy_names())
    assert get_strategy("reversed", "kl_map") == Reversed()
    assert get_strategy("lax_map", "kl_map", chunk_size=3, reduce="psum") == sv.parallel.LaxMap(3, "psum")
    with pytest.raises(ValueError, match=r"kl_map must be one of \(.*'reversed'.*\)"):
        get_strategy("nope", "kl_map")
    with pytest.raises(TypeError, match="apply to a strategy given by name only"):
        get_strategy(Vmap(), "kl_map", chunk_size=2)
    # the CLI lists the registry and checks --strategy against it
    assert main(["strategies"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(strategy_names())
    with pytest.raises(SystemExit):
        main(["compare", "--strategy", "nope"])
    assert "choose from" in capsys.readouterr().err
    # the demos build their strategy from the registry
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demos"))
    try:
        import _demo_utils as du
    finally:
        sys.path.pop(0)
    with pytest.raises(ValueError, match=r"--strategy reversed with --devices 1: .*\(Reversed\) takes no devices"):
        du.make_strategy("reversed", jax.devices()[:1])
    assert du.make_strategy("shard_map", jax.devices()[:2]) == sv.parallel.ShardMap(devices=jax.devices()[:2])
    with pytest.raises(ValueError, match=r"--strategy must be one of \(.*'reversed'"):
        du.make_strategy("nope", jax.devices()[:1])
    with pytest.raises(ValueError, match="--strategy vmap with --devices 2: .* runs on one device"):
        du.make_strategy("vmap", jax.devices()[:2])


def test_cli_help_names_only_registered_strategies(capsys):
    """``compare --help`` answers before JAX is imported, so it names strategies as examples: all registered."""
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    examples = re.search(r"a registered name, e\.g\. (.*?) \('python -m shardvi strategies' lists them all\)", text)
    names = set(re.findall(r"\w+", examples.group(1))) - {"default", "or"}
    assert names == set(sv.parallel.STRATEGY_NAMES) <= set(strategy_names())


def test_objects_that_are_no_strategy_are_refused():
    """Only Strategy subclasses are strategies: an object with map/mean methods is refused with what to do."""

    class Duck:
        name = "duck"

        def map(self, fn, in_axes):
            return Vmap().map(fn, in_axes)

        def mean(self, stacked):
            return jax.tree.map(lambda x: x.sum(0) / x.shape[0], stacked)

    for obj in (Duck(), object()):
        with pytest.raises(TypeError, match="must be a strategy name .* or a shardvi.parallel.Strategy object"):
            get_strategy(obj, "sample_map")
