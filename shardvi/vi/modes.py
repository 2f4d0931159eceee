"""Sample modes of ``optimize_kl`` and the policy that turns a mode into an action."""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["SampleMode", "SamplePlan", "SampleSource", "parse_sample_mode", "plan_samples", "recorded_as"]


class SampleMode(str, enum.Enum):
    """How samples are produced in a global iteration.

    - ``linear_resample``: fresh keys, MGVI (linear) residuals.
    - ``linear_sample``: the previous iteration's keys (same random numbers),
      MGVI residuals re-solved at the new position.
    - ``nonlinear_resample`` / ``nonlinear_sample``: likewise, then each
      residual is curved by the geoVI update.
    - ``nonlinear_update``: keep the previous residuals and curve them again at
      the new position (falls back to ``nonlinear_resample`` when there are none).
    """

    LINEAR_SAMPLE = "linear_sample"
    LINEAR_RESAMPLE = "linear_resample"
    NONLINEAR_SAMPLE = "nonlinear_sample"
    NONLINEAR_RESAMPLE = "nonlinear_resample"
    NONLINEAR_UPDATE = "nonlinear_update"

    @property
    def nonlinear(self) -> bool:
        return self.value.startswith("nonlinear")

    @property
    def fresh_keys(self) -> bool:
        return self.value.endswith("_resample")

    @property
    def update(self) -> bool:
        return self is SampleMode.NONLINEAR_UPDATE


def parse_sample_mode(mode, argname: str = "sample_mode") -> SampleMode:
    if isinstance(mode, SampleMode):
        return mode
    if not isinstance(mode, str):
        raise TypeError(f"{argname} must be a str, SampleMode or callable(iteration), got {type(mode).__name__}")
    try:
        return SampleMode(mode.lower())
    except ValueError:
        raise ValueError(f"{argname} must be one of {[m.value for m in SampleMode]}, got {mode!r}") from None


class SampleSource(str, enum.Enum):
    """Where one iteration's residuals come from.

    - ``none``: no samples (``n_samples=0``, MAP).
    - ``update``: the previous residuals, curved again at the new position.
    - ``reuse``: the previous iteration's keys, residuals solved afresh.
    - ``fresh``: keys split from the iteration's key, residuals solved afresh.
    """

    NONE = "none"
    UPDATE = "update"
    REUSE = "reuse"
    FRESH = "fresh"


class SamplePlan(NamedTuple):
    """What one iteration does to get its samples (see :func:`plan_samples`).

    Attributes
    ----------
    mode : SampleMode
        The mode actually run and recorded.
    source : SampleSource
        Where the residuals come from.
    fallback : bool
        ``nonlinear_update`` found no previous samples of the same count and
        runs as ``nonlinear_resample``.
    """

    mode: SampleMode
    source: SampleSource
    fallback: bool = False


def plan_samples(mode: SampleMode, n: int, n_prev: int) -> SamplePlan:
    """The sample-mode policy: how an iteration with ``mode`` and ``n`` pairs gets its residuals.

    Pure (no arrays, no side effects).

    Parameters
    ----------
    mode : SampleMode
        The iteration's requested mode.
    n : int
        Requested number of pairs (0: MAP).
    n_prev : int
        Number of sample keys the previous samples carry (0 if none).

    Returns
    -------
    SamplePlan
        ``n == 0``: ``none``. ``nonlinear_update``: ``update`` when the
        previous samples have ``n`` keys, else ``nonlinear_resample`` with
        ``fresh`` keys. ``*_sample``: ``reuse`` the previous keys when there
        are ``n`` of them, else ``fresh``. ``*_resample``: ``fresh``.
    """
    mode = parse_sample_mode(mode)
    same = n > 0 and n_prev == n
    if n == 0:
        source = SampleSource.NONE
    elif mode.update:
        source = SampleSource.UPDATE if same else SampleSource.FRESH
    else:
        source = SampleSource.REUSE if same and not mode.fresh_keys else SampleSource.FRESH
    if mode.update and source is SampleSource.FRESH:
        return SamplePlan(SampleMode.NONLINEAR_RESAMPLE, source, fallback=True)
    return SamplePlan(mode, source)


def recorded_as(mode: SampleMode, recorded: str) -> bool:
    """Whether an iteration asked to run ``mode`` may have been recorded as ``recorded``.

    It is recorded under the mode :func:`plan_samples` ran: ``nonlinear_update``
    without previous samples of the same count is recorded as
    ``nonlinear_resample``.
    """
    mode = parse_sample_mode(mode)
    return recorded == mode.value or (mode.update and recorded == SampleMode.NONLINEAR_RESAMPLE.value)
