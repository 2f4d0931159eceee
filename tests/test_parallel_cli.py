"""``python -m shardvi compare`` (run in-process on the test session's forced CPU devices)."""
import json

import pytest

from shardvi.__main__ import main


def test_compare_prints_zero_differences_in_reproducible_mode(capsys):
    rc = main(["compare", "--devices", "2", "--strategy", "pmap", "--demo", "wiener_1d", "--npix", "16",
               "--samples", "2", "--iterations", "1", "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    for name in ("samples", "mean", "std", "kl_energy"):
        assert res[name]["bitwise_equal"] and res[name]["max_abs"] == 0.0 and res[name]["max_rel"] == 0.0
    assert res["devices"] == 2 and res["strategy"] == "pmap" and res["time_n"] > 0


def test_compare_table_and_errors(capsys):
    from shardvi.__main__ import _format
    row = {"max_abs": 1e-16, "max_rel": 2e-16, "bitwise_equal": False}
    table = _format(dict(samples=row, mean=row, std=row, kl_energy=row, demo="d", strategy="jit", reduce="psum",
                         chunk_size=1, devices=4, n_samples=2, iterations=1, time_1=1.0, time_n=2.0))
    assert "max abs diff" in table and "1.000e-16" in table and "1 vs 4 devices" in table
    assert main(["compare", "--devices", "64"]) == 2
    assert "only 4 cpu device(s)" in capsys.readouterr().err
    assert main(["compare", "--devices", "2", "--strategy", "vmap"]) == 2
    assert "runs on one device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", "--strategy", "magic"])
