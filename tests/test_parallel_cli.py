"""``python -m shardvi compare`` (run in-process on the test session's forced CPU devices)."""

import json
import os
import subprocess
import sys

import pytest
from _timeouts import scaled

from shardvi.__main__ import main

pytestmark = pytest.mark.product_compiler  # the compare command: bitwise across device counts (tests/conftest.py)


@pytest.mark.slow
def test_compare_prints_zero_differences_in_reproducible_mode(capsys):
    rc = main(
        [
            "compare",
            "--devices",
            "2",
            "--strategy",
            "pmap",
            "--demo",
            "wiener_1d",
            "--npix",
            "16",
            "--n-samples",
            "2",
            "--iterations",
            "1",
            "--json",
        ]
    )
    assert rc == 0
    out, err = capsys.readouterr()
    res = json.loads(out)
    for name in ("samples", "mean", "std", "kl_energy"):
        assert res[name]["bitwise_equal"] and res[name]["max_abs"] == 0.0 and res[name]["max_rel"] == 0.0
    assert res["devices"] == 2 and res["strategy"] == "pmap" and res["time_n"] > 0 and res["n_samples"] == 2
    # progress on stderr (no terminal: one line per run and per iteration), the result alone on stdout
    lines = err.splitlines()
    assert [ln.split(":")[0] for ln in lines if ln.startswith("run ")] == ["run 1/2", "run 2/2"]
    assert "run 1/2: wiener_1d with pmap on 1 device(s)" in err and "run 2/2: wiener_1d with pmap on 2 device(s)" in err
    assert len([ln for ln in lines if ln.startswith("iteration 1/1 [linear_resample, 2 pairs]")]) == 2


@pytest.mark.parametrize("flags, progress", [([], "auto"), (["--quiet"], False)])
def test_compare_quiet_turns_progress_off(monkeypatch, capsys, flags, progress):
    """``--quiet`` passes ``progress=False`` (silent: tests/test_progress.py), else ``"auto"``."""
    import shardvi.__main__ as cli

    seen = {}

    def fake_compare(devices, strategy, demo, **kw):
        seen.update(kw)
        row = {"max_abs": 0.0, "max_rel": 0.0, "bitwise_equal": True}
        return dict(
            samples=row,
            mean=row,
            std=row,
            kl_energy=row,
            demo=demo,
            strategy=strategy,
            reduce="fixed",
            chunk_size=1,
            devices=devices,
            n_samples=kw["n_samples"],
            iterations=1,
            time_1=1.0,
            time_n=1.0,
        )

    monkeypatch.setattr(cli, "compare", fake_compare)
    assert main(["compare", "--devices", "2", "--n-samples", "3"] + flags) == 0
    assert seen["progress"] == progress and seen["n_samples"] == 3
    assert "3 sample pairs" in capsys.readouterr().out


def test_compare_help_answers_without_jax():
    """``python -m shardvi compare --help`` (a fresh process) does not import JAX."""
    code = (
        "import runpy, sys; sys.argv = ['shardvi', 'compare', '--help']\n"
        "try:\n    runpy.run_module('shardvi', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'matplotlib')))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert res.returncode == 0, res.stderr
    assert "--n-samples" in res.stdout and "--quiet" in res.stdout and "--samples " not in res.stdout
    assert res.stdout.strip().endswith("[]")


def test_compare_table_and_errors(capsys):
    from shardvi.__main__ import _format

    row = {"max_abs": 1e-16, "max_rel": 2e-16, "bitwise_equal": False}
    table = _format(
        dict(
            samples=row,
            mean=row,
            std=row,
            kl_energy=row,
            demo="d",
            strategy="jit",
            reduce="psum",
            chunk_size=1,
            devices=4,
            n_samples=2,
            iterations=1,
            time_1=1.0,
            time_n=2.0,
        )
    )
    assert "max abs diff" in table and "1.000e-16" in table and "1 vs 4 devices" in table
    assert main(["compare", "--devices", "64"]) == 2
    assert "only 4 cpu device(s)" in capsys.readouterr().err
    assert main(["compare", "--devices", "2", "--strategy", "vmap"]) == 2
    assert "runs on one device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", "--strategy", "magic"])
