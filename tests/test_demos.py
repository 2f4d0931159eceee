"""The demos run at small sizes, meet their checks and write valid PNG figures.

Each demo's ``main(argv)`` is called in this process (float64 and 4 forced CPU devices
from conftest); ``main`` returns the exit status: 0 only if the demo's own checks held.
"""

import importlib.util
import logging
import os
import re
import subprocess
import sys
import warnings

import jax
import matplotlib.image
import pytest
from _timeouts import scaled

import shardvi as sv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMOS = os.path.join(ROOT, "demos")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _restore_shardvi_log_level():
    """The demos set the ``shardvi`` logger's level (``--quiet``); keep other tests unaffected."""
    logger = logging.getLogger("shardvi")
    level = logger.level
    yield
    logger.setLevel(level)


def load(name):
    """Import ``demos/<name>.py`` as a module (the demos import their siblings from ``demos/``)."""
    if DEMOS not in sys.path:
        sys.path.insert(0, DEMOS)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(DEMOS, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def assert_pngs(folder, names):
    for name in names:
        path = os.path.join(folder, name)
        assert os.path.getsize(path) > 1000, name
        with open(path, "rb") as f:
            assert f.read(8) == PNG_MAGIC, name
        img = matplotlib.image.imread(path)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, (name, img.shape)
        assert img.std() > 0, f"{name} is blank"


def number(pattern, text):
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in output:\n{text}"
    return float(m.group(1))


@pytest.mark.product_compiler  # bound by its run time, which level 0 makes ~1.3x longer (tests/conftest.py)
@pytest.mark.slow
def test_flagship_meets_chi2_and_coverage(tmp_path, capsys):
    demo = load("correlated_field_2d")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", sv.ConvergenceWarning)
        status = demo.main(
            [
                "--npix",
                "48",
                "--n-samples",
                "6",
                "--iterations",
                "6",
                "--seed",
                "0",
                "--quiet",
                "--output",
                str(tmp_path),
            ]
        )
    assert [str(w.message) for w in caught if w.category is sv.ConvergenceWarning] == []  # every solve converges
    out, err = capsys.readouterr()
    assert status == 0, out
    assert "iteration" not in err  # --quiet: no progress
    chi2 = number(r"reduced chi\^2 of the likelihood residual .*?: ([0-9.]+)", out)
    cov = number(r"truth within posterior mean \+- 2 std: ([0-9.]+) %", out)
    assert abs(chi2 - 1) <= demo.CHI2_TOL and cov >= 100 * demo.COVERAGE_MIN
    assert "checks passed" in out
    assert_pngs(tmp_path, ["reconstruction.png", "samples.png", "power_spectrum.png", "convergence.png"])


def test_checks_reject_bad_results():
    check = load("correlated_field_2d").check
    assert check(1.05, 0.93) == []
    assert [m.split()[0] for m in check(1.2, 0.93)] == ["reduced"]
    assert [m.split()[0] for m in check(0.85, 0.5)] == ["reduced", "2-sigma"]
    assert len(check(float("nan"), float("nan"))) == 2
    radio_check = load("radio_imaging").check
    assert radio_check(1.1, 0.99, 0.8) == []
    assert len(radio_check(1.5, 0.7, 0.8)) == 2


@pytest.mark.slow
def test_radio_imaging(tmp_path, capsys):
    demo = load("radio_imaging")
    status = demo.main(
        [
            "--npix",
            "32",
            "--antennas",
            "8",
            "--times",
            "8",
            "--n-samples",
            "2",
            "--iterations",
            "3",
            "--linear-iterations",
            "3",
            "--devices",
            "2",
            "--strategy",
            "shard_map",
            "--model-shards",
            "2",
            "--quiet",
            "--output",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "(1 sample x 2 model shards, 8 data blocks)" in out
    c_mean = number(r"correlation with the truth: posterior mean ([0-9.-]+)", out)
    c_dirty = number(r"dirty image ([0-9.-]+)", out)
    assert c_mean > c_dirty
    assert_pngs(tmp_path, ["reconstruction.png", "samples.png", "uv_coverage.png", "convergence.png"])


def test_model_comparison_picks_the_true_prior(tmp_path, capsys):
    demo = load("model_comparison")
    argv = ["--npix", "48", "--n-samples", "6", "--iterations", "1", "--quiet", "--output", str(tmp_path)]
    status = demo.main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    assert number(r"the ELBO picks k0 = ([0-9.]+)", out) == demo.TRUE_K0
    assert_pngs(tmp_path, ["model_comparison.png"])


@pytest.mark.product_compiler  # two different programs, bitwise (tests/conftest.py)
@pytest.mark.slow
def test_multi_device_comparison_is_bitwise(tmp_path, capsys):
    demo = load("multi_device_comparison")
    status = demo.main(
        [
            "--devices",
            "4",
            "--strategy",
            "shard_map",
            "--npix",
            "16",
            "--n-samples",
            "3",
            "--iterations",
            "1",
            "--linear-iterations",
            "1",
            "--quiet",
            "--output",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    for key in ("samples", "mean", "std", "kl_energy"):
        assert re.search(rf"^{key}\s+0\.000e\+00\s+0\.000e\+00\s+yes$", out, re.M), out
    assert_pngs(tmp_path, ["comparison.png"])


@pytest.mark.parametrize(
    "name, argv, flag",
    [
        ("correlated_field_2d", ["--npix", "4"], "--npix"),
        ("correlated_field_2d", ["--n-samples", "0"], "--n-samples"),
        ("correlated_field_2d", ["--strategy", "nope"], "--strategy"),
        ("correlated_field_2d", ["--strategy", "vmap", "--devices", "2"], "--strategy vmap"),
        ("correlated_field_2d", ["--iterations", "2", "--linear-iterations", "3"], "--linear-iterations"),
        ("correlated_field_2d", ["--noise-std", "-1"], "--noise-std"),
        ("correlated_field_2d", ["--model-shards", "2", "--strategy", "vmap"], "--model-shards"),
        ("correlated_field_2d", ["--field-blocks", "3"], "--field-blocks"),
        ("correlated_field_2d", ["--model-shards", "2", "--field-blocks", "3", "--npix", "48"], "--field-blocks"),
        ("radio_imaging", ["--antennas", "2"], "--antennas"),
        ("radio_imaging", ["--noise-level", "0"], "--noise-level"),
        ("radio_imaging", ["--model-shards", "2"], "--model-shards"),
        ("radio_imaging", ["--model-shards", "2", "--strategy", "shard_map", "--devices", "3"], "--devices"),
        ("multi_device_comparison", ["--strategy", "vmap"], "--strategy"),
        ("multi_device_comparison", ["--devices", "1"], "--devices"),
        ("multi_device_comparison", ["--reduce", "sum"], "--reduce"),
        ("multi_device_comparison", ["--devices", "64"], "--devices=64"),
    ],
)
def test_bad_flags_name_the_argument(name, argv, flag, tmp_path):
    # start the backend with conftest's 4 CPU devices: run first in a process, --devices 64 would force 64
    jax.devices()
    demo = load(name)
    with pytest.raises(ValueError, match=re.escape(flag)):
        demo.main(argv + ["--output", str(tmp_path)])


COMMON_FLAGS = ("--n-samples", "--iterations", "--strategy", "--devices", "--seed", "--output", "--quiet")
SCRIPTS = [
    [os.path.join("demos", f"{name}.py")]
    for name in (
        "correlated_field_2d",
        "radio_imaging",
        "multi_device_comparison",
        "wiener_filter_1d",
        "model_comparison",
    )
]


def run_script(args):
    """``python -X importtime ARGS`` from the repository root; returns (rc, stdout, imported module names)."""
    res = subprocess.run(
        [sys.executable, "-X", "importtime"] + args,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=scaled(120),
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    imported = {ln.rsplit("|", 1)[1].strip() for ln in res.stderr.splitlines() if ln.startswith("import time:")}
    errors = [ln for ln in res.stderr.splitlines() if not ln.startswith("import time:")]
    return res.returncode, res.stdout, imported, "\n".join(errors)


@pytest.mark.parametrize("script", SCRIPTS + [["-m", "shardvi", "compare"]], ids=lambda a: a[-1])
def test_help_lists_the_common_flags_without_importing_jax(script):
    rc, out, imported, err = run_script(script + ["--help"])
    assert rc == 0, err
    assert "usage:" in out
    heavy = sorted(
        m
        for m in imported
        if m.split(".")[0] in ("jax", "jaxlib", "matplotlib", "jax_finufft")
        # the version string: no heavy imports of its own
        or (m.startswith("shardvi.") and m != "shardvi._version")
    )
    assert heavy == [], heavy
    flags = set(re.findall(r"--[a-z][a-z-]*", out))
    expected = set(COMMON_FLAGS) - ({"--output"} if script[0] == "-m" else set())  # compare writes no figures
    assert expected <= flags, expected - flags
    assert "--samples" not in flags


@pytest.mark.parametrize(
    "script, argv, message",
    [
        (SCRIPTS[3], ["--n-samples", "0"], "error: --n-samples must be an int >= 1, got 0"),
        (SCRIPTS[2], ["--reduce", "sum"], "error: --reduce must be one of ('fixed', 'psum'), got 'sum'"),
        (SCRIPTS[0], ["--samples", "3"], "unrecognized arguments: --samples 3"),
    ],
)
def test_scripts_reject_bad_flags_before_importing_jax(script, argv, message):
    rc, out, imported, err = run_script(script + argv)
    assert rc == 2 and message in err
    assert "jax" not in imported


def test_readme_names_the_common_flags():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    demos = readme[readme.index("## Demos") : readme.index("| command |")]
    assert all(f"`{flag}`" in demos for flag in COMMON_FLAGS)
    assert "--samples" not in readme.replace("--n-samples", "")


def test_multi_device_flag_values_match_shardvi():
    from shardvi import parallel

    demo = load("multi_device_comparison")
    assert demo.MULTI_DEVICE_NAMES == tuple(demo.MULTI_DEVICE)
    assert demo.REDUCE_MODES == tuple(parallel.REDUCE_MODES)


def test_wiener_demo_takes_the_common_flags():
    args = load("wiener_filter_1d").parse(
        [
            "--n-samples",
            "3",
            "--strategy",
            "shard_map",
            "--devices",
            "2",
            "--quiet",
            "--seed",
            "1",
            "--iterations",
            "2",
            "--output",
            "x",
        ]
    )
    assert (args.n_samples, args.strategy, args.devices, args.quiet, args.seed, args.iterations, args.output) == (
        3,
        "shard_map",
        2,
        True,
        1,
        2,
        "x",
    )
