"""The device-map planner: memory predicted from the compiled steps, "auto", refusal before any work, the CLI."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi.__main__ import main as cli
from shardvi._jax_compat import fixed_order_arithmetic
from shardvi.examples import build_demo
from shardvi.parallel import InsufficientMemoryError, ShardMap, Vmap

DEVICES = jax.devices()[:4]


@pytest.fixture(scope="module")
def problem():
    return build_demo("wiener_1d", npix=32, seed=1)


@pytest.fixture(scope="module")
def four_device_plan(problem):
    return sv.parallel.plan(
        problem.likelihood, problem.position, n_samples=8, devices=DEVICES, sample_mode="linear_resample"
    )


def test_plan_predicts_per_candidate_and_recommends_chunk_one_on_all_cpu_devices(four_device_plan):
    p = four_device_plan
    labels = [c.label for c in p.candidates]
    assert labels[:3] == ["Vmap chunk 1", "Vmap chunk 4", "Vmap chunk all"]
    assert any(lbl.startswith("ShardMap x4") for lbl in labels)
    for c in p.candidates:
        assert set(c.steps) == {"draw", "kl"} and all(v > 0 for v in c.steps.values())  # MGVI: no geoVI step
        assert c.peak == max(c.steps["draw"] + c.resident, c.steps["kl"])
        assert c.resident == 16 * 32 * 8  # 8 pairs of 32 float64 latents
    assert p.choice == ShardMap(devices=tuple(DEVICES), chunk_size=1)
    text = str(p)
    assert "peak/device" in text and "* ShardMap x4 chunk 1" in text and p.reason in text


def test_larger_chunks_need_more_memory_in_the_order_of_their_temporaries(four_device_plan):
    """The predictions rank the one-device candidates as the compiled programs' temporaries do; one sample at a
    time needs the least. (Between chunks of 4 and all 8 the order is the compiler's: with jax 0.12's pairwise
    sums in the KL step the chunked loop's scratch outweighs 4 more samples of this small problem.)"""
    vm = [c for c in four_device_plan.candidates if c.label.startswith("Vmap")]
    by_peak = sorted(vm, key=lambda c: c.peak)
    by_temp = sorted(vm, key=lambda c: c.temporaries["kl"])
    assert [c.label for c in by_peak] == [c.label for c in by_temp]
    assert by_peak[0].label == "Vmap chunk 1"
    if not fixed_order_arithmetic():
        assert [c.label for c in by_peak] == ["Vmap chunk 1", "Vmap chunk 4", "Vmap chunk all"]


def test_a_memory_limit_excludes_what_does_not_fit(four_device_plan):
    from shardvi.vi.planner import _recommend

    cands = four_device_plan.candidates
    peaks = sorted(c.peak for c in cands)
    limit = int(peaks[1] / 0.9) + 1  # only the two smallest fit
    chosen, _ = _recommend(cands, limit, "cpu")
    assert chosen.peak <= 0.9 * limit
    chosen, reason = _recommend(cands, 64, "cpu")
    assert "No candidate fits" in reason and chosen.peak == peaks[0]
    chosen, reason = _recommend(cands, None, "gpu")  # a GPU: the largest chunk on the most devices
    assert chosen.label == "ShardMap x4 chunk 4" and "bitwise equal to runs with the same per-device chunk" in reason


def test_auto_on_an_accelerator_compiles_candidates_in_order_of_preference_until_one_fits(problem, four_device_plan):
    from shardvi.vi.planner import _plan, _recommend
    from shardvi.vi.settings import DEFAULT_KL_MINIMIZATION, DEFAULT_LINEAR_SAMPLING, DEFAULT_NONLINEAR_UPDATE

    configs = (DEFAULT_LINEAR_SAMPLING, DEFAULT_NONLINEAR_UPDATE, DEFAULT_KL_MINIMIZATION)
    cands = four_device_plan.candidates

    def first_fit(limit):
        return _plan(
            problem.likelihood,
            problem.position,
            8,
            DEVICES,
            limit,
            "linear_resample",
            True,
            configs,
            False,
            first_fit=True,
            gpu=True,
        )

    preferred, _ = _recommend(cands, None, "gpu")
    p = first_fit(10 * max(c.peak for c in cands))  # everything fits: the preferred candidate alone is compiled
    assert [c.label for c in p.candidates] == [preferred.label] and p.choice == preferred.strategy
    assert p.candidates[0].peak == preferred.peak
    limit = int(preferred.peak / 0.9) - 1  # the preferred one no longer fits
    expected, _ = _recommend(cands, limit, "gpu")
    p = first_fit(limit)
    assert expected.label != preferred.label
    assert p.choice == expected.strategy and p.candidates[-1].label == expected.label
    assert len(p.candidates) < len(cands)  # the less preferred ones were never compiled


def _run(problem, **kw):
    return sv.optimize_kl(
        problem.likelihood,
        problem.position,
        key=jax.random.PRNGKey(3),
        n_total_iterations=2,
        n_samples=2,
        sample_mode="linear_resample",
        kl_minimization=sv.NewtonCGConfig(xtol=1e-6, maxiter=5),
        progress=False,
        **kw,
    )


@pytest.mark.parametrize("n_devices", [1, 4])
def test_auto_gives_the_bits_of_the_strategy_it_chose(problem, n_devices):
    devs = DEVICES[:n_devices]
    auto, _ = _run(problem, sample_map="auto", kl_map="auto", devices=devs)
    chosen = Vmap() if n_devices == 1 else ShardMap(devices=tuple(devs), chunk_size=1)
    explicit, _ = _run(problem, sample_map=chosen, kl_map=chosen)
    for a, b in zip(jax.tree.leaves(auto.to_host()), jax.tree.leaves(explicit.to_host()), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_impossible_size_is_refused_in_seconds_by_every_entry_point(problem):
    lh, pos = problem.likelihood, problem.position
    t0 = time.perf_counter()
    with pytest.raises(InsufficientMemoryError, match=r"n_samples=10000000000 cannot fit.*At most|n_samples=\d+ fit"):
        sv.optimize_kl(lh, pos, key=jax.random.PRNGKey(0), n_total_iterations=1, n_samples=10**10, progress=False)
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=(6, 40)))
    wlh = sv.Gaussian(rng.normal(size=6), noise_std=0.5).amend(
        sv.Model(lambda x: a @ x, jax.ShapeDtypeStruct((40,), jnp.float64))
    )
    with pytest.raises(InsufficientMemoryError, match="wiener_filter_posterior with n_samples=10000000000"):
        sv.wiener_filter_posterior(wlh, key=jax.random.PRNGKey(0), n_samples=10**10)
    samples, _ = sv.wiener_filter_posterior(wlh, key=jax.random.PRNGKey(0), n_samples=4)
    with pytest.raises(InsufficientMemoryError, match="the ELBO") as info:
        sv.estimate_evidence_lower_bound(wlh, samples, memory_limit=1000)
    assert info.value.limit == 1000 and info.value.predicted > 1000
    assert isinstance(info.value, sv.ShardviError) and isinstance(info.value, MemoryError)
    assert time.perf_counter() - t0 < 60  # refused before any sampling (the Wiener samples above included)


def test_cli_prints_the_plan(capsys):
    assert cli(["plan", "--demo", "wiener_1d", "--devices", "1", "--npix", "8", "--n-samples", "1"]) == 0
    out = capsys.readouterr().out
    assert "peak/device" in out and "* Vmap chunk 1" in out and "Vmap chunk all" in out
    assert cli(["plan", "--demo", "nope", "--devices", "1"]) == 2


def test_auto_calls_a_schedule_once_per_iteration(problem):
    calls = []

    def n_samples(i):
        calls.append(i)
        return 1 + i

    _, state = sv.optimize_kl(
        problem.likelihood,
        problem.position,
        key=jax.random.PRNGKey(0),
        n_total_iterations=2,
        n_samples=n_samples,
        sample_mode="linear_resample",
        kl_minimization=sv.NewtonCGConfig(xtol=1e-6, maxiter=3),
        sample_map="auto",
        kl_map="auto",
        devices=DEVICES,
        progress=False,
    )
    assert calls == [0, 1] and [r.n_samples for r in state.history] == [1, 2]


def test_arrays_split_over_processes_leave_out_the_one_device_candidates():
    """A field split over processes (``sv.parallel.field_array``) cannot run on one device: the plan offers only
    the meshes over all devices, with the model shards the field blocks allow (benchmarks/bench_plan.py
    ``--field-processes`` runs it over processes)."""
    import sys

    from shardvi.vi import planner

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_field_split import split_likelihood

    lh = split_likelihood(4)
    local = [label for _, label in planner._candidates(lh, DEVICES, 2, True)]
    across = [label for _, label in planner._candidates(lh, DEVICES, 2, True, split_over_processes=True)]
    assert any(x.startswith("Vmap") for x in local) and not any(x.startswith("Vmap") for x in across)
    assert across == [x for x in local if not x.startswith("Vmap")]
    assert {"ShardMap 1x4 chunk 1", "ShardMap 2x2 chunk 1", "ShardMap x4 chunk 1"} <= set(across)
