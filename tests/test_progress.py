"""Progress output of optimize_kl: a bar on a terminal, one line per iteration otherwise, silence on request."""

import io
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardvi as sv
from shardvi.compilation import CompileCounter
from shardvi.vi.progress import BarProgress, LineProgress, Progress, check_progress, open_display

N = 6
FAST = dict(
    linear_sampling=sv.CGConfig(tol=1e-8, maxiter=100),
    nonlinear_update=sv.NewtonCGConfig(xtol=1e-8, maxiter=10),
    kl_minimization=sv.NewtonCGConfig(xtol=1e-8, maxiter=10),
)
SUMMARY = re.compile(
    r"^iteration (\d+)/(\d+) \[(\w+), (\d+) pairs\] KL \S+ \| .* red\.chi2 lh \S+ prior \S+ \| "
    r"[0-9.]+ s$"
)


class FakeTTY(io.StringIO):
    """A terminal as far as ``isatty`` goes."""

    def isatty(self):
        return True


class Recorder(Progress):
    def __init__(self):
        self.calls = []

    def start_iteration(self, nit, total):
        self.calls.append(("start", nit, total))

    def stage(self, name, compiling):
        self.calls.append(("stage", name, compiling))

    def end_iteration(self, nit, total, line):
        self.calls.append(("end", nit, line))

    def close(self):
        self.calls.append(("close",))


@pytest.fixture(scope="module")
def lh():
    rng = np.random.default_rng(1)

    def call(x):
        return jnp.exp(0.3 * x)

    model = sv.Model(call, jax.ShapeDtypeStruct((N,), jnp.float64))
    data = np.asarray(call(rng.normal(size=N))) + 0.1 * rng.normal(size=N)
    return sv.Gaussian(data, noise_std=0.1).amend(model)


def run(lh, iterations=2, **kw):
    kw = {**dict(n_samples=1, sample_mode="linear_resample"), **FAST, **kw}
    return sv.optimize_kl(lh, jnp.zeros(N), key=jax.random.PRNGKey(0), n_total_iterations=iterations, **kw)


@pytest.mark.slow
def test_not_a_terminal_prints_one_summary_line_per_iteration(lh, capsys):
    _, state = run(lh, iterations=3)  # default progress="auto"; pytest's stderr is no terminal
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 3
    for i, (line, rep) in enumerate(zip(lines, state.history)):
        m = SUMMARY.match(line)
        assert m, line
        assert (int(m[1]), int(m[2]), m[3], int(m[4])) == (i + 1, 3, "linear_resample", 1)
        assert f"KL {rep.kl_energy:.6e}" in line


def test_progress_off_prints_nothing(lh, capsys):
    run(lh, progress=False, n_samples=0)
    assert capsys.readouterr() == ("", "")


@pytest.mark.slow
def test_terminal_shows_a_bar_with_stages_and_summaries(lh, monkeypatch):
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    # precompile=False: a step compiled ahead in the background is not marked compiling (timing-dependent)
    run(lh, iterations=2, sample_mode=lambda i: "linear_resample" if i == 0 else "nonlinear_resample", precompile=False)
    text = tty.getvalue()
    for label in (
        "iteration 1/2: compiling + MGVI sampling",
        "iteration 1/2: compiling + KL minimization",
        "iteration 2/2: MGVI sampling",
        "iteration 2/2: compiling + geoVI update",
        "iteration 2/2: KL minimization",
        "2/2 [",
    ):
        assert label in text, label
    assert "iteration 2/2: compiling + MGVI sampling" not in text  # compiled in iteration 1
    # the summary lines stay on screen above the bar
    summaries = [ln.split("\r")[-1] for ln in text.split("\n") if SUMMARY.match(ln.split("\r")[-1])]
    assert [s.split()[1] for s in summaries] == ["1/2", "2/2"]


@pytest.mark.slow
def test_stages_and_compiling_marks(lh, tmp_path):
    rec = Recorder()
    modes = ["linear_resample", "nonlinear_resample", "nonlinear_resample", "linear_resample"]
    run(
        lh,
        iterations=4,
        sample_mode=lambda i: modes[i],
        n_samples=lambda i: 2 if i < 3 else 1,
        progress=rec,
        checkpoint_dir=str(tmp_path / "ckpt"),
        precompile=False,  # every step compiles at its first stage (with it: timing-dependent marks)
    )
    per_iteration, current = [], None
    for call in rec.calls:
        if call[0] == "start":
            current = []
            per_iteration.append(current)
        elif call[0] == "stage":
            current.append(call[1:])
    assert per_iteration == [
        [("MGVI sampling", True), ("KL minimization", True), ("writing checkpoint", False)],
        [("MGVI sampling", False), ("geoVI update", True), ("KL minimization", False), ("writing checkpoint", False)],
        [("MGVI sampling", False), ("geoVI update", False), ("KL minimization", False), ("writing checkpoint", False)],
        # one pair instead of two: other shapes, compiled anew
        [("MGVI sampling", True), ("KL minimization", True), ("writing checkpoint", False)],
    ]
    assert [c[:2] for c in rec.calls if c[0] in ("start", "end")] == [
        ("start", 0),
        ("end", 0),
        ("start", 1),
        ("end", 1),
        ("start", 2),
        ("end", 2),
        ("start", 3),
        ("end", 3),
    ]
    assert rec.calls[-1] == ("close",) and rec.calls.count(("close",)) == 1


def test_display_is_closed_when_the_run_fails(lh):
    rec = Recorder()

    def boom(samples, state):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        run(lh, progress=rec, callback=boom, n_samples=0)
    assert rec.calls[-1] == ("close",)


def test_update_outside_run_reports_its_iteration(lh, capsys):
    opt = sv.OptimizeVI(lh, 2, n_samples=0, sample_mode="linear_resample", progress="lines", **FAST)
    samples = sv.Samples(jnp.zeros(N), jnp.zeros((0, N)))
    state = opt.init_state(jax.random.PRNGKey(0))
    samples, state = opt.update(samples, state)
    assert capsys.readouterr().err.startswith("iteration 1/2 [linear_resample")
    opt.update(samples, state)
    assert capsys.readouterr().err.startswith("iteration 2/2 [linear_resample")


class Switch(Progress):
    """Forwards to ``inner`` (exchangeable between runs)."""

    def __init__(self, inner):
        self.inner = inner

    def start_iteration(self, nit, total):
        self.inner.start_iteration(nit, total)

    def stage(self, name, compiling):
        self.inner.stage(name, compiling)

    def end_iteration(self, nit, total, line):
        self.inner.end_iteration(nit, total, line)

    def close(self):
        self.inner.close()


def test_progress_hooks_add_no_compilation_and_change_no_bit(lh):
    """The same compiled steps run silent, then with the bar: no compilation, bitwise the same samples."""
    switch = Switch(Progress())
    opt = sv.OptimizeVI(lh, 2, n_samples=1, sample_mode="nonlinear_resample", progress=switch, **FAST)
    start = sv.Samples(jnp.zeros(N), jnp.zeros((0, N)))
    counts = []
    with CompileCounter() as silent:
        quiet_samples, _ = opt.run(
            start, opt.init_state(jax.random.PRNGKey(0)), callback=lambda s, st: counts.append(silent.count)
        )
    assert counts[0] > 0 and counts[1] == counts[0], counts
    tty = FakeTTY()
    switch.inner = BarProgress(tty)
    with CompileCounter() as bar:
        bar_samples, _ = opt.run(start, opt.init_state(jax.random.PRNGKey(0)))
    assert bar.count == 0
    assert "iteration 2/2: KL minimization" in tty.getvalue()
    np.testing.assert_array_equal(np.asarray(bar_samples.samples), np.asarray(quiet_samples.samples))


@pytest.mark.parametrize(
    "value, err, match",
    [
        ("yes", ValueError, "progress must be True, False or one of"),
        (1, TypeError, "progress must be True, False, one of .* got int"),
        (LineProgress, TypeError, "got type"),
    ],
)
def test_bad_progress_is_rejected_before_running(lh, value, err, match):
    pos, key = jnp.zeros(N), jax.random.PRNGKey(0)  # made (and compiled, on jax 0.11) outside the count
    kw = {**dict(n_samples=1, sample_mode="linear_resample"), **FAST}
    with CompileCounter() as cc, pytest.raises(err, match=match):
        sv.optimize_kl(lh, pos, key=key, n_total_iterations=2, progress=value, **kw)
    assert cc.count == 0


def test_summary_is_printed_once_when_logging_prints_it(lh, capsys):
    """With ``logging.basicConfig(level=logging.INFO)``-style console logging the line appears once."""
    import logging

    logger = logging.getLogger("shardvi")
    handler = logging.StreamHandler(sys.stderr)  # capsys's stderr: a console as far as we know
    handler.setFormatter(logging.Formatter("LOG %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        run(lh, n_samples=0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    err = capsys.readouterr().err
    assert [ln[:18] for ln in err.splitlines()] == ["LOG iteration 1/2 ", "LOG iteration 2/2 "]


def test_bar_restores_logging_handlers(lh, monkeypatch):
    import logging

    handlers = list(logging.root.handlers)
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stderr", tty)
    run(lh, n_samples=0, iterations=1)
    assert logging.root.handlers == handlers
    assert "1/1 [" in tty.getvalue()


def test_auto_picks_bar_on_a_terminal_and_lines_elsewhere():
    assert isinstance(open_display("auto", FakeTTY()), BarProgress)
    assert isinstance(open_display(True, io.StringIO()), LineProgress)
    assert isinstance(open_display("bar", io.StringIO()), BarProgress)
    assert isinstance(open_display("lines", FakeTTY()), LineProgress)
    assert type(open_display(False, FakeTTY())) is Progress
    rec = Recorder()
    assert open_display(rec) is rec
    assert check_progress(True) == "auto" and check_progress(None) == "off"
