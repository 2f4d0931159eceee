"""Sample modes of ``optimize_kl``."""
from __future__ import annotations

import enum

__all__ = ["SampleMode", "parse_sample_mode"]


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
