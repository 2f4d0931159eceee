"""The benchmark scripts run (``--smoke``, shardvi side only) and write the documented JSON."""

import argparse
import json
import math
import os
import subprocess
import sys

import pytest
import scipy.optimize
from _timeouts import scaled

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


def _positive_finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _start(script, out):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, os.path.join(BENCH, script), "--smoke", "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def _finish(proc, name):
    try:
        stdout, stderr = proc.communicate(timeout=scaled(240))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, f"{name} failed:\n{stdout[-2000:]}\n{stderr[-3000:]}"
    assert "|" in stdout, f"{name} printed no markdown table:\n{stdout[-2000:]}"


@pytest.mark.slow
def test_bench_scaling_and_metric_smoke(tmp_path):
    # both at once: each is mostly XLA compilation in fresh processes
    scaling_json, metric_json = tmp_path / "scaling.json", tmp_path / "metric.json"
    scaling = _start("bench_scaling.py", scaling_json)
    metric = _start("bench_metric.py", metric_json)
    _finish(scaling, "bench_scaling.py")
    _finish(metric, "bench_metric.py")

    s = json.loads(scaling_json.read_text())
    assert set(s) >= {"meta", "records", "errors"} and not s["errors"]
    assert {r["sweep"] for r in s["records"]} == {"1-D", "2-D"}
    for r in s["records"]:
        for k in ("first_s", "iter_median_s", "compile_s", "rss_peak_mib", "rss_base_mib", "state_mib"):
            assert _positive_finite(r[k]), (k, r[k])
        assert r["n_latent"] >= r["n_pixels"] > 0 and r["n_compiles"] > 0
        assert len(r["iter_s"]) == r["iterations"] and all(_positive_finite(t) for t in r["iter_s"])

    m = json.loads(metric_json.read_text())
    assert set(m) >= {"meta", "records", "errors"} and not m["errors"]
    assert {(r["config"], r["size"]) for r in m["records"]} == {(c, n) for c in ("vmap", "vmap-all") for n in (16, 32)}
    for r in m["records"]:
        assert r["engine"] == "shardvi"
        for k in ("first_s", "median_s", "min_s", "process_rss_peak_mib"):
            assert _positive_finite(r[k]), (k, r[k])
        assert len(r["times_s"]) == m["meta"]["repeats"]
        assert math.isfinite(r["check"]) and r["check_rel_diff"] < 1e-10  # both strategies: the same metric


def _largest_search():
    sys.path.insert(0, BENCH)
    try:
        import bench_field_largest
    finally:
        sys.path.remove(BENCH)
    return bench_field_largest


@pytest.mark.parametrize(
    "peak",
    [
        # linear, with 100 MiB of fixed cost only at the small fit sizes: the fit overstates the slope a little
        lambda n: 400 + 150e-6 * n * n + (100 if n <= 1024 else 0),
        # steeper at large sizes than the fit says: the first run is over the budget and the search steps down
        lambda n: 300 + 100e-6 * n * n * (1 + n / 4000),
        # much flatter at large sizes (fixed costs at small ones): the search grows along the last secant
        lambda n: 400 + (300e-6 if n <= 1024 else 120e-6) * n * n,
    ],
    ids=["linear", "over", "under"],
)
def test_bench_field_largest_search(peak):
    """The largest-grid search (fit, verify, step down or grow) ends within the budget, near the true largest grid
    (a multiple of the blocks, within the half-step growth tolerance)."""
    L = _largest_search()
    true_max = scipy.optimize.brentq(lambda n: peak(n) - 4096.0, 1100.0, 20000.0)
    args = argparse.Namespace(fit=[512, 1024], blocks=8, budget_mib=4096.0, max_tries=4, step=0.05)
    out = L.largest(args, "fake", peak)
    v = out["verified"]
    assert v is not None and v["peak_mib"] <= 4096.0 and v["npix"] % 8 == 0
    assert peak(v["npix"]) == v["peak_mib"]
    assert 0.95 * true_max <= v["npix"] <= true_max
    assert v["npix"] == max(r["npix"] for r in out["runs"] if r["peak_mib"] <= 4096.0)  # the largest run within
