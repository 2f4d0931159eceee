"""Correlated field model: a Gaussian random field with a learned power spectrum.

The field on a regular grid (1-3 axes per sub-domain, several sub-domains combined
by an outer product of amplitudes) is

    s = offset_mean + H(c * xi),    c(k_1, ..., k_n) = azm * prod_i ahat_i(|k_i|),

with ``H`` the Hartley transform over all axes, ``xi`` white, ``azm`` the zero-mode
standard deviation (``offset_std`` prior), ``ahat_i(0) = 1`` and
``ahat_i(k) = sqrt(P_i(k) / V_i) / azm`` for ``k != 0``, where ``P_i`` is the power
spectrum of sub-domain ``i`` (a spectral density, see :mod:`.harmonic`) and ``V_i`` its
total volume. For one sub-domain ``c = sqrt(P / V)`` off the zero mode, so
``H(c xi) == harmonic_to_position(sqrt(V P) xi)``; the field's pixel variance
(zero mode excluded) is ``sum_k P(|k|) / V``. With several sub-domains it is
``azm^2 * (prod_i (1 + f_i^2 / azm^2) - 1)`` (``f_i`` the sub-domain fluctuations); the
parts that vary along a single sub-domain only have standard deviation ``f_i``.

Non-parametric spectrum (Arras et al. 2022, Nat. Astron., methods; NIFTy's
``CorrelatedFieldMaker``): on ``t = log|k| - log|k_1|`` over the non-zero modes,
``log-spectrum(t) = loglogavgslope * t + y(t)`` with ``y`` an integrated Wiener process
(``flexibility``; plus white increments of relative strength ``asperity``) whose end
points are pinned to 0, so ``loglogavgslope`` is the average log-log slope; the
spectrum is then normalized so that ``fluctuations`` is the standard deviation of the
field. Matern alternative: ``P(k) proportional to (1 + (k / cutoff)^2)^(loglogslope / 2)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from ..module import Module
from ..parallel.grid import is_slab, local_rows, pad_rows, take
from ..parallel.slab import layout_hartley
from .harmonic import RegularGrid, hartley
from .model import Model, check_real
from .priors import LogNormal, Normal, Prior, as_prior

__all__ = ["CorrelatedFieldMaker", "CorrelatedField", "NonParametricAmplitude", "MaternAmplitude", "Hyperparameter"]

_KINDS = ("amplitude", "power")


def _default_dtype(dtype):
    dtype = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def _check_prefix(prefix, argname):
    if not isinstance(prefix, str):
        raise TypeError(f"{argname} must be a str, got {type(prefix).__name__}")
    return prefix


@dataclass(frozen=True)
class Hyperparameter:
    """A scalar hyperparameter: fixed (``prior is None``) or ``prior(xi[name])``.

    Built by :meth:`make` from a float (fixed), a ``(mean, std)`` pair or a :class:`Prior`.
    """

    name: str
    prior: Prior | None = None
    value: float | None = None

    @classmethod
    def make(cls, spec, name: str, argname: str, kind: type, positive: bool) -> Hyperparameter:
        if isinstance(spec, (int, float, np.floating, np.integer)) and not isinstance(spec, bool):
            v = float(spec)
            if not math.isfinite(v) or (positive and v <= 0):
                raise ValueError(f"{argname} must be {'> 0' if positive else 'finite'}, got {v}")
            return cls(name, None, v)
        return cls(name, as_prior(spec, argname, kind), None)

    def domain(self, dtype) -> dict:
        return {} if self.prior is None else {self.name: self.prior.domain((), dtype)}

    def __call__(self, xi, dtype):
        if self.prior is None:
            return jnp.asarray(self.value, dtype)
        return self.prior(xi[self.name]).astype(dtype)


def _hyper_domain(hypers, dtype) -> dict:
    out = {}
    for h in hypers:
        if h is not None:
            out.update(h.domain(dtype))
    return out


def _normalized_log_power(log_shape, grid: RegularGrid, std):
    """``log P_j`` for the non-zero modes with ``sum_j mult_j P_j / V == std^2``."""
    mult = jnp.asarray(grid.multiplicity[1:], log_shape.dtype)
    lognorm = logsumexp(log_shape + jnp.log(mult))
    return log_shape - lognorm + 2 * jnp.log(std) + math.log(grid.total_volume)


#: block length of :func:`prefix_sum`
_PREFIX_BLOCK = 32


def prefix_sum(x):
    """``jnp.cumsum(x)`` of a 1-D array as small matrix products: a blocked prefix sum.

    ``x`` (zero-padded to ``m * b`` entries, ``b = min(32, n)``) is read as an
    ``(m, b)`` matrix; the prefix sums within the blocks are ``X @ U`` with ``U``
    the upper triangular ``(b, b)`` matrix of ones, and each block is offset by the
    prefix sum of the totals of the blocks before it (the same function on the
    ``m`` totals, so the constant matrix stays ``(b, b)`` at any length). The values
    are those of ``jnp.cumsum`` up to the order of the additions. XLA:CPU lowers
    ``cumsum`` to a reduce-window that it rewrites into a tree of windowed
    reductions, slow to run in the many copies the engine's solvers hold (the model,
    its linearization and transpose at each call site); this form runs faster there
    (the engine's KL minimization step in particular). Products
    at ``Precision.HIGHEST`` (no reduced-precision matrix units on accelerators).
    """
    if x.ndim != 1 or x.shape[0] == 0:
        return jnp.cumsum(x)
    n = x.shape[0]
    b = min(_PREFIX_BLOCK, n)
    m = -(-n // b)
    blocks = jnp.pad(x, (0, m * b - n)).reshape(m, b)
    # built from iotas, not a literal: no (b, b) constant embedded in every program that uses it
    rows = jax.lax.broadcasted_iota(jnp.int32, (b, b), 0)
    upper = (rows <= jax.lax.broadcasted_iota(jnp.int32, (b, b), 1)).astype(x.dtype)
    within = jnp.matmul(blocks, upper, precision=jax.lax.Precision.HIGHEST)
    if m > 1:
        before = prefix_sum(within[:-1, -1])  # totals of the blocks before each block
        within = within + jnp.concatenate([jnp.zeros((1,), x.dtype), before])[:, None]
    return within.reshape(-1)[:n]


@dataclass(frozen=True, eq=False)
class NonParametricAmplitude(Module):
    """Non-parametric power spectrum of one sub-domain.

    Latent names (``prefix`` + ...): ``fluctuations``, ``loglogavgslope``,
    ``flexibility``, ``asperity`` (scalars, when not fixed) and ``spectrum`` (shape
    ``(2, M - 2)``: velocity and integral increments of the integrated Wiener
    process on the ``M - 1`` non-zero log-|k| nodes).

    ``kind="amplitude"`` (default) models ``log sqrt(P)``, ``kind="power"``
    models ``log P``: with ``"amplitude"`` the power spectrum's log-log slope is
    ``2 * loglogavgslope``.
    """

    grid: RegularGrid
    fluctuations: Hyperparameter
    loglogavgslope: Hyperparameter
    flexibility: Hyperparameter | None
    asperity: Hyperparameter | None
    prefix: str
    kind: str = "amplitude"

    def domain(self, dtype) -> dict:
        out = _hyper_domain((self.fluctuations, self.loglogavgslope, self.flexibility, self.asperity), dtype)
        if self.flexibility is not None:
            n = len(self.grid.mode_lengths) - 2
            out[self.prefix + "spectrum"] = jax.ShapeDtypeStruct((2, n), dtype)
        return out

    def std(self, xi, dtype):
        """Standard deviation of the sub-field (the ``fluctuations`` value)."""
        return self.fluctuations(xi, dtype)

    def log_power(self, xi, dtype):
        """``log P(|k|)`` on ``grid.mode_lengths[1:]``, shape (M-1,)."""
        t = jnp.asarray(self.grid.log_mode_lengths, dtype)
        log_spec = self.loglogavgslope(xi, dtype) * t
        if self.flexibility is not None:
            dt = t[1:] - t[:-1]
            flex = self.flexibility(xi, dtype)
            asp = self.asperity(xi, dtype) if self.asperity is not None else jnp.zeros((), dtype)
            exc = xi[self.prefix + "spectrum"]
            # exact integrated-Wiener-process increments: slope deviation v, its integral y
            v = jnp.concatenate([jnp.zeros((1,), dtype), prefix_sum(flex * jnp.sqrt(dt) * exc[0])])
            dy = 0.5 * dt * (v[:-1] + v[1:]) + flex * jnp.sqrt(dt**3 / 12.0 + asp * dt) * exc[1]
            y = jnp.concatenate([jnp.zeros((1,), dtype), prefix_sum(dy)])
            log_spec = log_spec + (y - y[-1] * t / t[-1])  # end points pinned: slope stays the average
        if self.kind == "amplitude":
            log_spec = 2 * log_spec
        return _normalized_log_power(log_spec, self.grid, self.std(xi, dtype))


@dataclass(frozen=True, eq=False)
class MaternAmplitude(Module):
    """Matern power spectrum ``P(k) = P0 * (1 + (k / cutoff)^2)^(loglogslope / 2)`` of one sub-domain.

    With ``renormalize=True`` ``P0`` is set so that ``scale`` is the standard deviation
    of the sub-field (zero mode excluded); otherwise ``P0 = scale^2`` (a spectral
    density at ``k -> 0``, units field^2 * length^ndim). ``cutoff`` is in cycles per
    unit length. Latent names: ``prefix`` + ``scale``, ``cutoff``, ``loglogslope``.
    """

    grid: RegularGrid
    scale: Hyperparameter
    cutoff: Hyperparameter
    loglogslope: Hyperparameter
    prefix: str
    renormalize: bool = True

    def domain(self, dtype) -> dict:
        return _hyper_domain((self.scale, self.cutoff, self.loglogslope), dtype)

    def _log_shape(self, xi, dtype):
        k = jnp.asarray(self.grid.mode_lengths[1:], dtype)
        return 0.5 * self.loglogslope(xi, dtype) * jnp.log1p((k / self.cutoff(xi, dtype)) ** 2)

    def log_power(self, xi, dtype):
        """``log P(|k|)`` on ``grid.mode_lengths[1:]``, shape (M-1,)."""
        log_shape = self._log_shape(xi, dtype)
        if self.renormalize:
            return _normalized_log_power(log_shape, self.grid, self.scale(xi, dtype))
        return log_shape + 2 * jnp.log(self.scale(xi, dtype))

    def std(self, xi, dtype):
        """Standard deviation of the sub-field (zero mode excluded)."""
        if self.renormalize:
            return self.scale(xi, dtype)
        mult = jnp.asarray(self.grid.multiplicity[1:], dtype)
        return jnp.exp(0.5 * (logsumexp(self.log_power(xi, dtype) + jnp.log(mult)) - math.log(self.grid.total_volume)))


Amplitude = NonParametricAmplitude | MaternAmplitude


class CorrelatedField(Model):
    """The model built by :meth:`CorrelatedFieldMaker.finalize`; ``field = model(xi)``.

    Attributes
    ----------
    grids : tuple of RegularGrid
        The sub-domains, in the order their axes appear in the field.
    k_lengths : tuple of ndarray
        ``grids[i].mode_lengths`` (unique ``|k|``, cycles per unit length).
    offset_mean : float
    prefix : str
    """

    def __init__(self, amplitudes: tuple, zero_mode: Hyperparameter, offset_mean: float, prefix: str, dtype):
        self.amplitudes = tuple(amplitudes)
        self.zero_mode = zero_mode
        self.offset_mean = float(offset_mean)
        self.prefix = prefix
        self.dtype = jnp.dtype(dtype)
        self.field_shape = sum((a.grid.shape for a in self.amplitudes), ())
        domain = dict(zero_mode.domain(dtype))
        for amp in self.amplitudes:
            sub = amp.domain(dtype)
            clash = set(sub) & set(domain)
            if clash:
                raise ValueError(f"latent names {sorted(clash)} are used twice; give each sub-domain its own prefix")
            domain.update(sub)
        xi_name = prefix + "xi"
        if xi_name in domain:
            raise ValueError(f"latent name {xi_name!r} clashes with a hyperparameter; change the prefixes")
        domain[xi_name] = jax.ShapeDtypeStruct(self.field_shape, dtype)
        self._xi_name = xi_name
        self.set_domain(domain)

    @property
    def grids(self) -> tuple:
        """The sub-domains' :class:`RegularGrid`\\ s, in the order their axes appear in the field."""
        return tuple(a.grid for a in self.amplitudes)

    @property
    def k_lengths(self) -> tuple:
        """``grids[i].mode_lengths`` (unique ``|k|``, cycles per unit length)."""
        return tuple(g.mode_lengths for g in self.grids)

    def __call__(self, xi):
        """The field, shape ``field_shape`` (one compiled program per model structure and dtype).

        ``xi`` is a dict holding every entry of :attr:`domain` with its shape (further
        entries are ignored); under ``jax.vmap`` the shapes are those of one latent.
        A missing entry or a wrong shape is a ``ValueError`` naming the entry, read
        from the static shapes only.
        """
        self._check_xi(xi)
        return _field_jit(self, xi)

    def _check_xi(self, xi) -> None:
        """``TypeError`` / ``ValueError`` unless ``xi`` has every domain entry with the domain's shape.

        Only shapes and dtypes are read (traced values pass). A field split over devices
        (a :class:`~shardvi.parallel.grid.Slab` entry) holds a device's rows: its shape is
        the layout's, not checked here.
        """
        if not isinstance(xi, Mapping):
            raise TypeError(
                f"xi must be a dict of latent arrays with the entries {sorted(self.domain)}, got {type(xi).__name__}"
            )
        for name, want in self.domain.items():
            if name not in xi:
                raise ValueError(f"xi has no entry {name!r}; the model's latent has the entries {sorted(self.domain)}")
            leaf = xi[name]
            if is_slab(leaf):
                continue
            check_real(leaf, f"xi[{name!r}]", "a real array")
            if tuple(np.shape(leaf)) != tuple(want.shape):
                raise ValueError(
                    f"xi[{name!r}] has shape {tuple(np.shape(leaf))}, expected {tuple(want.shape)} (the model's "
                    "domain; map over several latents with jax.vmap)"
                )

    # ---------------------------------------------------------------- pieces
    def zero_mode_std(self, xi):
        """``azm``: standard deviation of the field's mean (the ``offset_std`` value)."""
        return self.zero_mode(xi, self.dtype)

    def power_spectrum(self, xi, component: int = 0):
        """Power spectrum ``P(|k|)`` of sub-domain ``component`` on ``k_lengths[component]``.

        Returns
        -------
        array, shape (M,)
            ``P[0] = V * azm^2`` (the zero mode), ``P[1:]`` the spectral density of the
            sub-field (units field^2 * length^ndim; ``sum(mult * P) / V`` is its variance).
        """
        self._check_xi(xi)
        return _power_spectrum_jit(self, xi, self._component(component))

    def _power_spectrum(self, xi, component):
        amp = self.amplitudes[component]
        v = amp.grid.total_volume
        p0 = v * self.zero_mode_std(xi) ** 2
        return jnp.concatenate([p0[None], jnp.exp(amp.log_power(xi, self.dtype))])

    def amplitude_spectrum(self, xi, component: int = 0):
        """``sqrt(power_spectrum(xi, component))``."""
        return jnp.sqrt(self.power_spectrum(xi, component))

    def fluctuations(self, xi, component: int = 0):
        """Standard deviation of sub-domain ``component``'s sub-field (zero mode excluded)."""
        self._check_xi(xi)
        return _fluctuations_jit(self, xi, self._component(component))

    def _fluctuations(self, xi, component):
        return self.amplitudes[component].std(xi, self.dtype)

    def _amplitude_table(self, xi):
        """The harmonic amplitude per ``|k|`` bin of the one sub-domain: ``[azm, a_1, a_2, ...]`` (bin 0: zero mode)."""
        amp = self.amplitudes[0]
        log_a = 0.5 * (amp.log_power(xi, self.dtype) - math.log(amp.grid.total_volume))
        return jnp.concatenate([self.zero_mode_std(xi)[None], jnp.exp(log_a)])

    def harmonic_amplitude(self, xi):
        """``c`` on the full harmonic grid (FFT order), shape ``field_shape``: ``field = offset + H(c * xi)``."""
        if len(self.amplitudes) == 1:
            # one gather from the table [azm, a_k]: no product azm * ahat[index], whose JVP (a multiply-add over
            # the grid) XLA:CPU contracts into an FMA in some programs and not in others (batched per-sample
            # code against Vmap's unbatched code), 1 ulp apart
            return self._amplitude_table(xi)[jnp.asarray(self.amplitudes[0].grid.power_index)]
        azm = self.zero_mode_std(xi)
        out = azm
        ndim = len(self.field_shape)
        start = 0
        for amp in self.amplitudes:
            g = amp.grid
            log_a = 0.5 * (amp.log_power(xi, self.dtype) - math.log(g.total_volume))
            ahat = jnp.concatenate([jnp.ones((1,), self.dtype), jnp.exp(log_a) / azm])
            full = ahat[jnp.asarray(g.power_index)]
            shape = (1,) * start + g.shape + (1,) * (ndim - start - g.ndim)
            out = out * full.reshape(shape)
            start += g.ndim
        return out

    def total_fluctuations(self, xi):
        """Expected pixel standard deviation with the zero mode excluded: ``azm * sqrt(prod(1 + (f_i/azm)^2) - 1)``."""
        azm = self.zero_mode_std(xi)
        q = jnp.ones((), self.dtype)
        for i in range(len(self.amplitudes)):
            q = q * (1 + (self._fluctuations(xi, i) / azm) ** 2)
        return azm * jnp.sqrt(q - 1)

    def hyperparameters(self, xi) -> dict:
        """Realized scalar hyperparameters by latent-style name (fixed ones included)."""
        out = {self.zero_mode.name: self.zero_mode(xi, self.dtype)}
        for amp in self.amplitudes:
            for f in ("fluctuations", "loglogavgslope", "flexibility", "asperity", "scale", "cutoff", "loglogslope"):
                h = getattr(amp, f, None)
                if h is not None:
                    out[h.name] = h(xi, self.dtype)
        return out

    def _component(self, i):
        if not isinstance(i, (int, np.integer)) or not -len(self.amplitudes) <= i < len(self.amplitudes):
            raise IndexError(f"component must be an int in [0, {len(self.amplitudes)}), got {i!r}")
        return int(i) % len(self.amplitudes)

    def _field(self, xi):
        if is_slab(xi[self._xi_name]):
            return self._slab_field(xi)
        c = self.harmonic_amplitude(xi)
        return self.offset_mean + hartley(c * xi[self._xi_name])

    def _slab_field(self, xi):
        """The field's local slab from a latent whose excitations are a :class:`~shardvi.parallel.grid.Slab`.

        Field parallelism: ``c`` is read per block from the replicated spectrum (its gradient
        summed in block order) and the Hartley transform is the slab transform, so the slab
        and its derivatives are bitwise the same on any number of devices sharing the grid.
        Returns the local slab (an array: element-wise operations on it just work).
        """
        slab = xi[self._xi_name]
        if len(self.amplitudes) != 1 or self.amplitudes[0].grid.ndim < 2:
            raise ValueError(
                "a correlated field split over devices needs one sub-domain with at least 2 axes (the slab "
                f"transform splits grid axis 0 and transposes into axis 1); this one has grids {self.grids}"
            )
        layout = slab.layout
        g = self.amplitudes[0].grid
        index = jnp.asarray(g.power_index)  # whole, or the device's rows (split like the data by the strategy)
        # whole: cut to the device's rows (with the layout's padding rows, which read mode 0 of a zero latent)
        rows = index if index.shape[0] != g.shape[0] else local_rows(pad_rows(index, layout), layout)
        c = take(self._amplitude_table(xi), rows, layout)
        return self.offset_mean + layout_hartley(c * slab.value, layout)

    def __repr__(self):
        return (
            f"CorrelatedField(prefix={self.prefix!r}, shape={self.field_shape}, "
            f"grids={self.grids}, latent={sorted(self.domain)})"
        )


# compiled once per model structure and latent dtype (the model is an argument: its grids are not constants);
# eager op-by-op evaluation would compile every primitive separately
_field_jit = jax.jit(lambda model, xi: model._field(xi))
_field_jit.__name__ = "correlated_field"  # pyright: ignore[reportAttributeAccessIssue] -- jit wrappers take it
_power_spectrum_jit = jax.jit(lambda model, xi, c: model._power_spectrum(xi, c), static_argnums=2)
_fluctuations_jit = jax.jit(lambda model, xi, c: model._fluctuations(xi, c), static_argnums=2)


class CorrelatedFieldMaker:
    """Builder for :class:`CorrelatedField`; every ``add_*``/``set_*`` returns ``self``.

    Hyperparameters are given as a fixed float, a ``(mean, std)`` pair (log-normal for
    positive quantities, normal for slopes) or any :class:`~shardvi.models.priors.Prior`.
    Latent names are ``prefix + sub_prefix + name``.

    >>> cf = CorrelatedFieldMaker("cf")
    >>> cf.set_amplitude_total_offset(0.0, (1e-3, 1e-4))
    >>> cf.add_fluctuations((128,), 1.0, fluctuations=(1.0, 0.5), loglogavgslope=(-2.0, 0.5),
    ...                     flexibility=(1.0, 0.5), asperity=None, prefix="x")
    >>> model = cf.finalize()   # latent: cfzeromode, cfxfluctuations, ..., cfxi
    """

    def __init__(self, prefix: str = "cf", dtype=None):
        self.prefix = _check_prefix(prefix, "prefix")
        self.dtype = _default_dtype(dtype)
        self._amplitudes: list = []
        self._zero_mode: Hyperparameter | None = None
        self._offset_mean: float | None = None

    def set_amplitude_total_offset(self, offset_mean: float, offset_std) -> CorrelatedFieldMaker:
        """Field mean ``offset_mean + azm * xi_0`` with ``azm`` from ``offset_std`` (log-normal ``(mean, std)``)."""
        try:
            m = float(offset_mean)
        except (TypeError, ValueError):
            raise TypeError(f"offset_mean must be a real number, got {offset_mean!r}") from None
        if not math.isfinite(m):
            raise ValueError(f"offset_mean must be finite, got {m}")
        self._offset_mean = m
        self._zero_mode = Hyperparameter.make(offset_std, self.prefix + "zeromode", "offset_std", LogNormal, True)
        return self

    def add_fluctuations(
        self,
        shape,
        distances,
        fluctuations,
        loglogavgslope,
        flexibility=None,
        asperity=None,
        *,
        prefix: str = "",
        kind: str = "amplitude",
    ) -> CorrelatedFieldMaker:
        """Add a sub-domain with a non-parametric spectrum.

        Parameters
        ----------
        shape : int or tuple of int
            Pixels per axis (1-3 axes).
        distances : float or tuple of float
            Pixel size per axis.
        fluctuations : float, (mean, std) or Prior
            Standard deviation of the sub-field (log-normal).
        loglogavgslope : float, (mean, std) or Prior
            Average slope of the log-spectrum vs ``log|k|`` (normal).
        flexibility : float, (mean, std), Prior or None
            Strength of the integrated-Wiener-process deviations (log-normal); None: pure power law.
        asperity : float, (mean, std), Prior or None
            Relative strength of white (non-smooth) deviations; needs ``flexibility``.
        prefix : str
            Sub-domain prefix for the latent names.
        kind : {"amplitude", "power"}
            Whether the slope and deviations describe ``log sqrt(P)`` or ``log P``.
        """
        grid = RegularGrid(shape, distances)
        sub = self.prefix + _check_prefix(prefix, "prefix")
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        if asperity is not None and flexibility is None:
            raise ValueError("asperity needs flexibility (the asperity scales the flexibility's deviations)")
        if flexibility is not None and len(grid.mode_lengths) < 3:
            raise ValueError(f"flexibility needs at least 2 distinct non-zero |k| (grid shape {grid.shape})")
        amp = NonParametricAmplitude(
            grid=grid,
            fluctuations=Hyperparameter.make(fluctuations, sub + "fluctuations", "fluctuations", LogNormal, True),
            loglogavgslope=Hyperparameter.make(loglogavgslope, sub + "loglogavgslope", "loglogavgslope", Normal, False),
            flexibility=None
            if flexibility is None
            else Hyperparameter.make(flexibility, sub + "flexibility", "flexibility", LogNormal, True),
            asperity=None
            if asperity is None
            else Hyperparameter.make(asperity, sub + "asperity", "asperity", LogNormal, True),
            prefix=sub,
            kind=kind,
        )
        self._amplitudes.append(amp)
        return self

    def add_fluctuations_matern(
        self, shape, distances, scale, cutoff, loglogslope, *, renormalize_amplitude: bool = True, prefix: str = ""
    ) -> CorrelatedFieldMaker:
        """Add a sub-domain with a Matern spectrum ``P(k) ~ (1 + (k/cutoff)^2)^(loglogslope/2)``.

        Parameters
        ----------
        scale : float, (mean, std) or Prior
            Sub-field standard deviation (``renormalize_amplitude=True``) or ``sqrt(P(0))`` (log-normal).
        cutoff : float, (mean, std) or Prior
            Knee of the spectrum in cycles per unit length (log-normal).
        loglogslope : float, (mean, std) or Prior
            Asymptotic log-log slope of the power spectrum (normal; e.g. ``-(2 nu + ndim)``).
        """
        grid = RegularGrid(shape, distances)
        sub = self.prefix + _check_prefix(prefix, "prefix")
        if not isinstance(renormalize_amplitude, bool):
            raise TypeError(f"renormalize_amplitude must be a bool, got {type(renormalize_amplitude).__name__}")
        amp = MaternAmplitude(
            grid=grid,
            scale=Hyperparameter.make(scale, sub + "scale", "scale", LogNormal, True),
            cutoff=Hyperparameter.make(cutoff, sub + "cutoff", "cutoff", LogNormal, True),
            loglogslope=Hyperparameter.make(loglogslope, sub + "loglogslope", "loglogslope", Normal, False),
            prefix=sub,
            renormalize=renormalize_amplitude,
        )
        self._amplitudes.append(amp)
        return self

    def finalize(self) -> CorrelatedField:
        """Build the :class:`CorrelatedField` model."""
        if self._zero_mode is None or self._offset_mean is None:
            raise ValueError("call set_amplitude_total_offset(offset_mean, offset_std) before finalize()")
        if not self._amplitudes:
            raise ValueError("add at least one sub-domain (add_fluctuations or add_fluctuations_matern)")
        ndim = sum(a.grid.ndim for a in self._amplitudes)
        if ndim > 8:
            raise ValueError(f"the field has {ndim} axes in total; at most 8 are supported")
        return CorrelatedField(tuple(self._amplitudes), self._zero_mode, self._offset_mean, self.prefix, self.dtype)
