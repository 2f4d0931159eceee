"""Device-map strategies: how a per-sample function is mapped over samples.

A strategy turns ``fn(*args)`` into a function over a leading *sample axis*
(like ``jax.vmap``) and reduces stacked per-sample results to their mean. The
engine only ever calls these methods, inside ``jax.jit``, so a strategy that
spreads samples over devices drops in without touching the engine:

- ``map(fn, in_axes)``: ``in_axes`` is a tuple with ``0`` (mapped over the
  leading axis) or ``None`` (broadcast) per positional argument; returns the
  stacked outputs, leading axis = number of samples, in sample order.
- ``mean(stacked)``: mean over the leading axis in a fixed order, so the
  result does not depend on how the samples were spread out.
- optional ``map_mean(fn, in_axes)``: the mean of ``fn`` over the samples in
  one step (multi-device strategies use it for the fast ``reduce="psum"``
  mode); :func:`map_mean` falls back to ``mean(map(...))``.
- optional ``place(tree)``: put host inputs where the strategy computes
  (:func:`place` falls back to the identity). Placing every input of a
  compiled step the same way in every iteration keeps JAX's compilation
  cache hit (a new input sharding would mean a new compilation).

Reproducibility
---------------
XLA:CPU results depend on the batch shape a computation is vectorized with.
In the default reproducible mode every strategy evaluates the samples in
vectorized chunks of exactly ``chunk_size`` samples (default 1), each sample
at the same position of its chunk (padding the sample axis with copies of the
last sample, whose results are dropped), with the chunk loop's trip count and
the model's floating-point constants hidden from XLA
(:mod:`shardvi.parallel.reproducible`), and averages with the fixed-order
sum :func:`fixed_order_mean` over all gathered samples in sample order.
Compiled with :func:`~shardvi.parallel.reproducible_jit` (as
:class:`~shardvi.OptimizeVI` does),
samples, KL values, gradients, metric applications and whole Newton-CG
trajectories are then bitwise identical for every strategy and device count
with the same ``chunk_size``. ``reduce="psum"`` (fast mode) sums per device
and then across devices (``psum``); each such mean differs from the
reproducible one by about one ulp.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jax import tree_util as jtu

from .reproducible import opaque_per_sample
from .mesh import leading_size, pad_samples

__all__ = ["Strategy", "Vmap", "LaxMap", "get_strategy", "fixed_order_mean", "map_mean", "place",
           "chunked_apply", "Placed", "REDUCE_MODES", "STRATEGY_NAMES",
           "register_strategy"]

REDUCE_MODES = ("fixed", "psum")


@runtime_checkable
class Strategy(Protocol):
    """Protocol every device-map strategy implements."""

    name: str

    def map(self, fn: Callable, in_axes: tuple) -> Callable: ...

    def mean(self, stacked): ...


def fixed_order_mean(stacked):
    """Mean over the leading axis, summing samples strictly left to right.

    ``jnp.mean`` lets XLA pick a reduction tree that can depend on the batch
    size; an explicit sequential sum is bitwise stable. The sum is scaled by
    ``1 / n`` (rounded once, in Python): XLA may turn a division by a scalar
    into a multiplication by its reciprocal in some programs and not in
    others, an explicit multiplication is the same everywhere.
    """
    def one(x):
        n = x.shape[0]
        if n == 0:
            raise ValueError("cannot average over zero samples")
        acc = jax.lax.fori_loop(1, n, lambda i, a: a + x[i], x[0])
        return acc * (1.0 / n)
    return jtu.tree_map(one, stacked)


def tree_mean(stacked):
    """Fast (tree-reduction) mean over the leading axis; may differ from :func:`fixed_order_mean` by ~1 ulp."""
    return jtu.tree_map(lambda x: jnp.sum(x, axis=0) * (1.0 / x.shape[0]), stacked)


def map_mean(strategy, fn: Callable, in_axes: tuple) -> Callable:
    """``args -> mean_i fn(args_i)`` with ``strategy`` (its ``map_mean`` if it has one)."""
    fused = getattr(strategy, "map_mean", None)
    if fused is not None:
        return fused(fn, in_axes)
    return lambda *args: strategy.mean(strategy.map(fn, in_axes)(*args))


def place(strategy, tree):
    """``strategy.place(tree)`` if the strategy places its inputs, else ``tree`` unchanged."""
    fn = getattr(strategy, "place", None)
    return tree if fn is None else fn(tree)


def check_in_axes(in_axes, n_args):
    """Validate a ``map`` in_axes tuple against the number of positional arguments."""
    if not isinstance(in_axes, (tuple, list)):
        raise TypeError(f"in_axes must be a tuple of 0/None (one per positional argument), got {in_axes!r}")
    if len(in_axes) != n_args:
        raise ValueError(f"in_axes has {len(in_axes)} entries for {n_args} arguments")
    if any(a not in (0, None) or isinstance(a, bool) for a in in_axes):
        raise ValueError(f"in_axes entries must be 0 or None, got {in_axes}")
    if all(a is None for a in in_axes):
        raise ValueError("at least one argument must be mapped (in_axes entry 0)")


def check_chunk(chunk_size, argname="chunk_size", allow_none=True):
    """A positive int (or ``None`` where allowed)."""
    if chunk_size is None and allow_none:
        return
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        what = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"{argname} must be {what}, got {chunk_size!r}")


def check_reduce(reduce):
    """``reduce`` must be one of :data:`REDUCE_MODES`."""
    if reduce not in REDUCE_MODES:
        raise ValueError(f"reduce must be one of {REDUCE_MODES} ('fixed': bitwise reproducible all-gather + "
                         f"fixed-order sum; 'psum': fast, ~1 ulp differences), got {reduce!r}")


def _with_mapped(args, in_axes, xs):
    it = iter(xs)
    return [next(it) if ax == 0 else a for a, ax in zip(args, in_axes)]


def _varying_axes(x) -> tuple:
    """Manual mesh axes ``x`` varies over (``shard_map`` with ``check_vma=True``), else ``()``."""
    mat = getattr(jax.typeof(x), "mat", None)
    return tuple(sorted(getattr(mat, "varying", ()) or ()))


def chunked_apply(fn: Callable, in_axes: tuple, args: tuple, chunk: Optional[int]):
    """Evaluate ``fn`` per sample in vectorized chunks of exactly ``chunk`` samples.

    The mapped arguments' leading axis must be a multiple of ``chunk``. The
    chunks are visited by a ``lax.fori_loop`` whose body is ``vmap(fn)`` over
    one chunk, so every sample sees the same batch shape wherever it is
    placed. ``chunk=None`` vectorizes the whole axis at once (one ``vmap``).
    """
    xs = tuple(a for a, ax in zip(args, in_axes) if ax == 0)

    def one(*x):
        return fn(*_with_mapped(args, in_axes, x))

    example = jtu.tree_map(lambda x: x[0], xs)  # one sample, with the inputs' types (incl. shard_map's vma)
    consts, run, out_shape = opaque_per_sample(one, example)
    if chunk is None:
        return jax.vmap(run, in_axes=(None,) + (0,) * len(xs))(consts, *xs)
    n = jtu.tree_leaves(xs)[0].shape[0]
    if n % chunk:
        raise ValueError(f"internal: {n} samples are not a multiple of the chunk size {chunk}")
    # one spare chunk (never computed): with a single chunk the slice blocks[i] would not depend on i and
    # XLA would hoist the whole per-sample computation out of the loop into a differently optimized context
    n_chunks = n // chunk
    blocks = jtu.tree_map(lambda x: jnp.concatenate([x, x[-chunk:]]).reshape((n_chunks + 1, chunk) + x.shape[1:]),
                          xs)
    out0 = jtu.tree_map(lambda s: jnp.zeros((n_chunks + 1, chunk) + s.shape, s.dtype), out_shape)
    varying = _varying_axes(jtu.tree_leaves(blocks)[0])
    if varying:  # inside shard_map(check_vma=True): the output buffer carry must be device-varying too
        out0 = jtu.tree_map(lambda o: jax.lax.pcast(o, varying, to="varying"), out0)

    def body(i, carry):
        consts, blocks, out = carry
        x = jtu.tree_map(lambda b: jax.lax.dynamic_index_in_dim(b, i, keepdims=False), blocks)
        y = jax.vmap(run, in_axes=(None,) + (0,) * len(xs))(consts, *x)
        out = jtu.tree_map(lambda o, v: jax.lax.dynamic_update_index_in_dim(o, v, i, 0), out, y)
        return consts, blocks, out
    # a trip count XLA cannot see: a loop of one chunk is not inlined into (and optimized with) its context
    trips = jax.lax.optimization_barrier(jnp.asarray(n_chunks, jnp.int32))
    _, _, ys = jax.lax.fori_loop(0, trips, body, (consts, blocks, out0))
    return jtu.tree_map(lambda y: y[:n_chunks].reshape((n,) + y.shape[2:]), ys)


def _strip(tree, n):
    return jtu.tree_map(lambda y: y[:n], tree)


def _single_device_map(fn, in_axes, chunk, name):
    def mapped(*args):
        check_in_axes(in_axes, len(args))
        n = leading_size(args, in_axes, name)
        if chunk is None:
            return chunked_apply(fn, in_axes, args, None)
        n_pad = math.ceil(n / chunk) * chunk
        padded = [pad_samples(a, n_pad) if ax == 0 else a for a, ax in zip(args, in_axes)]
        return _strip(chunked_apply(fn, in_axes, tuple(padded), chunk), n)
    return mapped


def _local_device():
    return jax.local_devices()[0]


@dataclasses.dataclass(frozen=True)
class Vmap:
    """Vectorize over samples on one device, in chunks of ``chunk_size`` samples.

    Parameters
    ----------
    chunk_size : int or None
        Samples per vectorized batch (bounds memory). The default 1 evaluates
        the samples one after the other in a loop — the reproducible
        reference every multi-device strategy with the same ``chunk_size`` is
        bitwise equal to. ``None`` vectorizes all samples at once (fastest
        for small models; results then depend on the sample count in the last
        bits).
    reduce : {"fixed", "psum"}
        ``"fixed"``: fixed-order mean (bitwise reproducible); ``"psum"``: tree
        reduction (``jnp.sum``), ~1 ulp different.
    """

    chunk_size: Optional[int] = 1
    reduce: str = "fixed"
    name: str = dataclasses.field(default="vmap", init=False)

    def __post_init__(self):
        check_chunk(self.chunk_size)
        check_reduce(self.reduce)

    def map(self, fn, in_axes):
        return _single_device_map(fn, in_axes, self.chunk_size, self.name)

    def mean(self, stacked):
        return fixed_order_mean(stacked) if self.reduce == "fixed" else tree_mean(stacked)

    def place(self, tree):
        """Commit inputs to the first local device."""
        return jax.device_put(tree, _local_device())


@dataclasses.dataclass(frozen=True)
class LaxMap:
    """Loop over samples sequentially: lowest memory.

    Parameters
    ----------
    batch_size : int or None
        Samples vectorized per loop step (default 1, bitwise identical to
        ``Vmap(chunk_size=1)``); ``None`` loops over unbatched samples
        (``jax.lax.map`` without ``batch_size``).
    reduce : {"fixed", "psum"}
        As for :class:`Vmap`.
    """

    batch_size: Optional[int] = 1
    reduce: str = "fixed"
    name: str = dataclasses.field(default="lax_map", init=False)

    def __post_init__(self):
        check_chunk(self.batch_size, "batch_size")
        check_reduce(self.reduce)

    def map(self, fn, in_axes):
        if self.batch_size is not None:
            return _single_device_map(fn, in_axes, self.batch_size, self.name)

        def mapped(*args):
            check_in_axes(in_axes, len(args))
            xs = tuple(a for a, ax in zip(args, in_axes) if ax == 0)
            return jax.lax.map(lambda x: fn(*_with_mapped(args, in_axes, x)), xs)
        return mapped

    def mean(self, stacked):
        return fixed_order_mean(stacked) if self.reduce == "fixed" else tree_mean(stacked)

    def place(self, tree):
        """Commit inputs to the first local device."""
        return jax.device_put(tree, _local_device())


_FACTORIES: dict = {"vmap": Vmap, "lax_map": LaxMap}
STRATEGY_NAMES = ("vmap", "lax_map", "pmap", "shard_map", "jit")
_SINGLE_DEVICE = ("vmap", "lax_map")


def register_strategy(name: str, factory: Callable) -> None:
    """Make ``factory(devices=...)`` available under ``name`` (used by multi-device strategies)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory must be callable(devices=...), got {type(factory).__name__}")
    _FACTORIES[name] = factory


def get_strategy(spec, argname: str = "sample_map", devices=None):
    """Resolve a strategy name or object.

    Parameters
    ----------
    spec : str or Strategy
        One of ``STRATEGY_NAMES`` or an object with ``map`` and ``mean``.
    argname : str
        Argument name used in error messages.
    devices : sequence of jax.Device, optional
        Devices for multi-device strategies given by name (``None``: all).

    Raises
    ------
    TypeError
        ``spec`` is a strategy class rather than an instance, not a strategy,
        or an object whose ``map``/``mean`` fail or return wrong shapes on a
        small probe (traced with ``jax.eval_shape``: nothing is compiled).
    ValueError
        ``devices`` would be ignored: the one-device strategies (``"vmap"``,
        ``"lax_map"``, :class:`Vmap`, :class:`LaxMap`) run on
        ``jax.local_devices()[0]`` and accept only ``None`` or exactly that
        device; a strategy object carries its own devices, so ``devices``
        must be ``None`` or equal to them.
    """
    from .mesh import check_devices
    devices = check_devices(devices, "devices")
    if isinstance(spec, type):
        raise TypeError(f"{argname} is the class {spec.__name__}, not a strategy object: instantiate it, e.g. "
                        f"{argname}={spec.__name__}() or {spec.__name__}(devices=...)")
    if isinstance(spec, str):
        if spec not in _FACTORIES:
            names = tuple(dict.fromkeys(STRATEGY_NAMES + tuple(_FACTORIES)))
            if spec in STRATEGY_NAMES:
                raise NotImplementedError(f"{argname}={spec!r} is not available in this build")
            raise ValueError(f"{argname} must be one of {names} or a strategy object, got {spec!r}")
        factory = _FACTORIES[spec]
        if spec in _SINGLE_DEVICE:
            _check_single_device(devices, repr(spec), argname)
            return factory()
        return factory(devices=devices)
    if isinstance(spec, (Vmap, LaxMap)):
        _check_single_device(devices, f"{type(spec).__name__}()", argname)
        return spec
    if isinstance(spec, Strategy):
        own = getattr(spec, "devices", None)
        if devices is not None and (own is None or tuple(own) != devices):
            raise ValueError(f"devices={[str(d) for d in devices]} is used only with a strategy given by name; "
                             f"{argname} is a {type(spec).__name__} object with devices={own}: set the devices "
                             f"on the object ({type(spec).__name__}(devices=...)) and leave devices=None")
        if not type(spec).__module__.startswith("shardvi.parallel"):
            _probe_strategy(spec, argname)
        return spec
    raise TypeError(f"{argname} must be a strategy name {STRATEGY_NAMES} or an object with map() and mean(), "
                    f"got {type(spec).__name__}")


def _check_single_device(devices, what: str, argname: str) -> None:
    """A one-device strategy with ``devices``: only ``None`` or the device it runs on."""
    if devices is None:
        return
    if len(devices) > 1:
        raise ValueError(f"devices lists {len(devices)} devices but {argname}={what} runs on one device and "
                         f"would ignore them: use a multi-device strategy ('shard_map', 'pmap', 'jit') or "
                         f"leave devices=None")
    if devices[0] != _local_device():
        raise ValueError(f"devices=[{devices[0]}] but {argname}={what} always runs on {_local_device()} "
                         f"(jax.local_devices()[0]): leave devices=None or use a multi-device strategy")


_PROBE_SAMPLES = 8


def _probe_strategy(spec, argname: str) -> None:
    """Trace ``spec.map`` / ``spec.mean`` (and ``map_mean``) on a tiny problem and check the output shapes.

    A foreign strategy that returns the wrong thing would otherwise fail deep
    inside the engine's compiled steps with a JAX-internal message.
    """
    for attr in ("map", "mean"):
        if not callable(getattr(spec, attr, None)):
            raise TypeError(f"{argname}: {type(spec).__name__}.{attr} must be callable")
    n = _PROBE_SAMPLES
    xs = jax.ShapeDtypeStruct((n, 2), jnp.float32)
    b = jax.ShapeDtypeStruct((2,), jnp.float32)

    def fn(x, y):
        return x * y

    def probe(x, y):
        stacked = spec.map(fn, (0, None))(x, y)
        fused = getattr(spec, "map_mean", None)
        return stacked, spec.mean(stacked), (None if fused is None else fused(fn, (0, None))(x, y))

    try:
        stacked, mean, fused = jax.eval_shape(probe, xs, b)
    except Exception as err:  # noqa: BLE001 -- reported with the argument's name
        raise TypeError(f"{argname}: the strategy object {type(spec).__name__} failed on a probe (map of "
                        f"x * y over {n} samples of shape (2,), then mean): {type(err).__name__}: {err}") from err
    expect = {"map(fn, in_axes)(...)": (stacked, (n, 2)), "mean(stacked)": (mean, (2,))}
    if fused is not None:
        expect["map_mean(fn, in_axes)(...)"] = (fused, (2,))
    for what, (got, shape) in expect.items():
        if not isinstance(got, jax.ShapeDtypeStruct) or tuple(got.shape) != shape:
            desc = f"shape {tuple(got.shape)}" if isinstance(got, jax.ShapeDtypeStruct) else repr(got)
            raise TypeError(f"{argname}: {type(spec).__name__}.{what} returned {desc} on a probe of {n} samples "
                            f"of shape (2,); expected an array of shape {shape}")


class Placed:
    """A jitted function whose positional inputs are first :func:`place`-d by a strategy.

    Placing every input the same way in every call keeps the jit cache hit
    (an input with a new sharding would trigger a new compilation) and puts
    the computation on the strategy's devices. ``lower`` places too, so
    ``Placed(...).lower(*args).compile()`` inspects exactly what runs.
    """

    def __init__(self, strategy, jitted):
        self.strategy = strategy
        self.__wrapped__ = jitted

    def __call__(self, *args, **kwargs):
        return self.__wrapped__(*place(self.strategy, args), **kwargs)

    def lower(self, *args, **kwargs):
        return self.__wrapped__.lower(*place(self.strategy, args), **kwargs)
