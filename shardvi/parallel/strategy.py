"""Device-map strategies: the :class:`Strategy` base, the registry and the shared pieces.

A strategy turns a per-sample function ``fn(*args)`` into a function over a
leading *sample axis* (like ``jax.vmap``) and reduces stacked per-sample
results to their mean. The engine only calls strategies inside its compiled
steps, through :meth:`Strategy.map`, :func:`map_mean` and :func:`place`, so a
strategy that spreads samples over devices drops in without touching it.

Built in (each in its own module, registered there by name):
:class:`~shardvi.parallel.Vmap` (``"vmap"``), :class:`~shardvi.parallel.LaxMap`
(``"lax_map"``), :class:`~shardvi.parallel.Pmap` (``"pmap"``),
:class:`~shardvi.parallel.ShardMap` (``"shard_map"``) and
:class:`~shardvi.parallel.JitSharding` (``"jit"``). A new strategy is one
file: subclass :class:`Strategy`, implement ``map`` (see the contract in its
docstring) and, to make it available by name, call :func:`register_strategy`.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import tree_util as jtu

from ..tree_math import per_sample_work
from .mesh import check_devices
from .reproducible import opaque_per_sample

__all__ = [
    "Strategy",
    "get_strategy",
    "fixed_order_mean",
    "ordered_sum",
    "map_mean",
    "place",
    "chunked_apply",
    "Placed",
    "REDUCE_MODES",
    "register_strategy",
    "strategy_names",
    "strategy_class",
]

REDUCE_MODES = ("fixed", "psum")


class Strategy(abc.ABC):
    """Base of the device-map strategies: ``map`` is required, the rest are shared parts.

    Subclasses implement :meth:`map`; :meth:`mean` (from the ``reduce``
    setting), :meth:`map_mean` and :meth:`place` have working defaults. The
    built-in strategies are frozen dataclasses (hashable: a strategy is part
    of the engine's compiled-step cache key); a new one should be too.

    Attributes
    ----------
    name : str
        Short name used in messages (the registered name of the built-ins).
    reduce : {"fixed", "psum"}
        How :meth:`mean` reduces: ``"fixed"`` (default) is the bitwise
        reproducible fixed-order sum, ``"psum"`` the fast mode.
    devices : tuple of jax.Device or None
        The devices the strategy computes on (``None``: decided at use).

    Notes
    -----
    **The bitwise contract.** XLA:CPU results depend on the batch shape a
    computation is vectorized with and on what it can see of the surrounding
    program. A strategy keeps results bitwise equal across device counts
    (and equal to ``Vmap(chunk_size=c)``, the reference) when it

    1. evaluates ``fn`` with :func:`chunked_apply` in chunks of exactly ``c``
       samples, each sample at the same position of its chunk wherever it is
       placed: pad the sample axis to a multiple of ``c`` per device with
       copies of the last sample (:func:`~shardvi.parallel.mesh.pad_samples`)
       and drop their results. :func:`chunked_apply` also hides the loop's
       trip count and the model's floating-point constants from XLA;
    2. returns the stacked outputs in sample order, gathered onto every
       device (an all-gather; the solvers' loops need no collectives);
    3. averages with :func:`fixed_order_mean` over the gathered samples in
       sample order (``reduce="fixed"``: all-gather, then a fixed-order
       reduction — never a ``psum``/``pmean`` tree over devices);
    4. relies on the random keys being split on the host, one per sample
       (the engine does this): every draw is then independent of placement;
    5. is compiled with :func:`~shardvi.parallel.reproducible_jit` (as
       :class:`~shardvi.OptimizeVI` does), which also pins the XLA passes
       that would otherwise rewrite the same arithmetic differently.

    Then samples, KL values, gradients, metric applications and whole
    Newton-CG trajectories are bitwise identical for every strategy and
    device count with the same ``c``. ``reduce="psum"`` gives up step 3 for
    speed: per-device sums reduced across devices (:meth:`fast_map_mean`);
    each mean then differs from the reproducible one by about one ulp, and
    the solvers amplify that over the iterations. Verified for the jax
    version pinned in ``pyproject.toml`` on XLA:CPU.
    """

    name: str = "strategy"
    reduce: str = "fixed"
    devices: tuple | None = None

    @abc.abstractmethod
    def map(self, fn: Callable, in_axes: tuple) -> Callable:
        """``args -> stacked fn(args_i)``: map ``fn`` over the leading sample axis.

        Parameters
        ----------
        fn : callable
            The per-sample function (a pytree of arrays out).
        in_axes : tuple of {0, None}
            One entry per positional argument: ``0`` maps over the leading
            axis, ``None`` broadcasts.

        Returns
        -------
        callable
            Takes the arguments, returns the stacked outputs (leading axis =
            number of samples, in sample order).
        """

    def mean(self, stacked):
        """Mean over the leading axis: :func:`fixed_order_mean` (``reduce="fixed"``) or a tree reduction."""
        return fixed_order_mean(stacked) if self.reduce == "fixed" else tree_mean(stacked)

    def map_mean(self, fn: Callable, in_axes: tuple) -> Callable:
        """``args -> mean_i fn(args_i)``: ``mean(map(...))``, or :meth:`fast_map_mean` for ``reduce="psum"``."""
        if self.reduce == "fixed":
            return lambda *args: self.mean(self.map(fn, in_axes)(*args))
        return self.fast_map_mean(fn, in_axes)

    def fast_map_mean(self, fn: Callable, in_axes: tuple) -> Callable:
        """The ``reduce="psum"`` mean (override with per-device sums and a ``psum``); default ``mean(map(...))``."""
        return lambda *args: self.mean(self.map(fn, in_axes)(*args))

    def place(self, tree):
        """Put host inputs where the strategy computes (default: unchanged).

        Placing every input of a compiled step the same way in every call
        keeps JAX's compilation cache hit (a new input sharding would mean a
        new compilation).
        """
        return tree

    def accept_devices(self, devices: tuple | None, argname: str = "sample_map") -> Strategy:
        """``self`` if a ``devices`` argument given beside it (already validated) agrees with it.

        Default: ``devices`` must be ``None`` or this strategy's own devices.
        """
        if devices is not None and self.devices is None and "devices" not in _init_parameters(type(self)):
            raise ValueError(
                f"devices={[str(d) for d in devices]} but {argname}={self.name!r} "
                f"({type(self).__name__}) takes no devices (it computes where JAX puts its inputs): "
                f"leave devices=None"
            )
        if devices is not None and (self.devices is None or tuple(self.devices) != devices):
            raise ValueError(
                f"devices={[str(d) for d in devices]} is used only with a strategy given by name; "
                f"{argname} is a {type(self).__name__} object with devices={self.devices}: set the "
                f"devices on the object ({type(self).__name__}(devices=...)) and leave devices=None"
            )
        return self

    @classmethod
    def create(cls, devices: tuple | None = None, argname: str = "sample_map", **options) -> Strategy:
        """The strategy :func:`get_strategy` returns for this class's registered name.

        Default: ``cls(devices=devices, **options)`` if the constructor takes
        ``devices``, else ``cls(**options)`` checked against ``devices``
        (:meth:`accept_devices`).
        """
        if "devices" in _init_parameters(cls):
            return cls(devices=devices, **options)  # pyright: ignore[reportCallIssue] -- checked: a subclass's field
        return cls(**options).accept_devices(devices, argname)


def _init_parameters(cls) -> tuple:
    """Names of the constructor's parameters."""
    try:
        return tuple(inspect.signature(cls).parameters)
    except (TypeError, ValueError):  # no signature to read: assume no devices
        return ()


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
        return ordered_sum(x) * (1.0 / n)

    return jtu.tree_map(one, stacked)


def ordered_sum(stacked):
    """Sum over the leading axis strictly left to right (bitwise independent of how the entries were computed)."""
    return jtu.tree_map(lambda x: jax.lax.fori_loop(1, x.shape[0], lambda i, a: a + x[i], x[0]), stacked)


def tree_mean(stacked):
    """Fast (tree-reduction) mean over the leading axis; may differ from :func:`fixed_order_mean` by ~1 ulp."""
    return jtu.tree_map(lambda x: jnp.sum(x, axis=0) * (1.0 / x.shape[0]), stacked)


def map_mean(strategy: Strategy, fn: Callable, in_axes: tuple) -> Callable:
    """``args -> mean_i fn(args_i)`` with ``strategy`` (:meth:`Strategy.map_mean`)."""
    return strategy.map_mean(fn, in_axes)


def place(strategy: Strategy, tree):
    """``strategy.place(tree)``: host inputs put where ``strategy`` computes (:meth:`Strategy.place`)."""
    return strategy.place(tree)


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


#: the largest chunk size (samples per device and program): an int32 loop bound of the compiled programs
MAX_CHUNK = 2**31 - 1


def check_chunk(chunk_size, argname="chunk_size", allow_none=True):
    """A positive int up to :data:`MAX_CHUNK` (or ``None`` where allowed)."""
    if chunk_size is None and allow_none:
        return
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_CHUNK:
        what = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"{argname} must be {what} (at most {MAX_CHUNK}), got {chunk_size!r}")


def check_reduce(reduce):
    """``reduce`` must be one of :data:`REDUCE_MODES`."""
    if reduce not in REDUCE_MODES:
        raise ValueError(
            f"reduce must be one of {REDUCE_MODES} ('fixed': bitwise reproducible all-gather + "
            f"fixed-order sum; 'psum': fast, ~1 ulp differences), got {reduce!r}"
        )


def _with_mapped(args, in_axes, xs):
    it = iter(xs)
    return [next(it) if ax == 0 else a for a, ax in zip(args, in_axes)]


def _varying_axes(x) -> tuple:
    """Manual mesh axes ``x`` varies over (``shard_map`` with ``check_vma=True``), else ``()``."""
    mat = getattr(jax.typeof(x), "mat", None)
    return tuple(sorted(getattr(mat, "varying", ()) or ()))


def chunked_apply(fn: Callable, in_axes: tuple, args: tuple, chunk: int | None, *, copy_free: bool = False):
    """Evaluate ``fn`` per sample in vectorized chunks of exactly ``chunk`` samples.

    The mapped arguments' leading axis must be a multiple of ``chunk``. The
    chunks are visited by a ``lax.fori_loop`` whose body is ``vmap(fn)`` over
    one chunk, so every sample sees the same batch shape wherever it is
    placed; with ``chunk=1`` the body is ``fn`` itself, unbatched (tracing a
    ``vmap`` over a batch of one through the solvers' nested loops took longer
    than tracing the solvers). ``chunk=None`` vectorizes the whole axis at once
    (one ``vmap``).

    The loop reads one spare chunk past the end so that XLA never sees a slice
    that does not depend on the loop index (see below): by default the mapped
    arguments are copied with a spare chunk appended. ``copy_free=True`` (for
    large mapped arguments, e.g. data blocks) reads them in place instead and
    selects between the indexed chunk and a separate copy of the last chunk:
    one chunk of temporary memory instead of a copy of the whole axis.
    """
    xs = tuple(a for a, ax in zip(args, in_axes) if ax == 0)

    def one(*x):
        return fn(*_with_mapped(args, in_axes, x))

    example = jtu.tree_map(lambda x: x[0], xs)  # one sample, with the inputs' types (incl. shard_map's vma)
    with per_sample_work():  # the same program on every device count: XLA's reductions keep their bits
        consts, run, out_shape = opaque_per_sample(one, example)
    if chunk is None:
        return jax.vmap(run, in_axes=(None,) + (0,) * len(xs))(consts, *xs)
    n = jtu.tree_leaves(xs)[0].shape[0]
    if n % chunk:
        raise ValueError(f"internal: {n} samples are not a multiple of the chunk size {chunk}")
    # one spare chunk (never computed): with a single chunk the slice blocks[i] would not depend on i and
    # XLA would hoist the whole per-sample computation out of the loop into a differently optimized context
    n_chunks = n // chunk
    if copy_free:  # the chunks in place (a reshape) and the spare: a copy of the last chunk only
        blocks = jtu.tree_map(lambda x: x.reshape((n_chunks, chunk) + x.shape[1:]), xs)
        spare = jtu.tree_map(lambda x: x[-chunk:], xs)
    else:
        blocks = jtu.tree_map(
            lambda x: jnp.concatenate([x, x[-chunk:]]).reshape((n_chunks + 1, chunk) + x.shape[1:]), xs
        )
        spare = None
    out0 = jtu.tree_map(lambda s: jnp.zeros((n_chunks + 1, chunk) + s.shape, s.dtype), out_shape)
    varying = _varying_axes(jtu.tree_leaves(blocks)[0])
    if varying:  # inside shard_map(check_vma=True): the output buffer carry must be device-varying too
        out0 = jtu.tree_map(lambda o: jax.lax.pcast(o, varying, to="varying"), out0)

    def read(blocks, spare, i):
        if spare is None:
            return jtu.tree_map(lambda b: jax.lax.dynamic_index_in_dim(b, i, keepdims=False), blocks)
        # chunk i for i < n_chunks, else the spare: never a slice XLA could prove independent of i
        at = jnp.minimum(i, n_chunks - 1)
        return jtu.tree_map(
            lambda b, s: jnp.where(i < n_chunks, jax.lax.dynamic_index_in_dim(b, at, keepdims=False), s), blocks, spare
        )

    def body(i, carry):
        consts, (blocks, spare), out = carry
        x = read(blocks, spare, i)
        if chunk == 1:  # one sample per pass: the per-sample program itself, no vmap (see the docstring)
            y = jtu.tree_map(lambda v: v[None], run(consts, *jtu.tree_map(lambda b: b[0], x)))
        else:
            y = jax.vmap(run, in_axes=(None,) + (0,) * len(xs))(consts, *x)
        out = jtu.tree_map(lambda o, v: jax.lax.dynamic_update_index_in_dim(o, v, i, 0), out, y)
        return consts, (blocks, spare), out

    # a trip count XLA cannot see: a loop of one chunk is not inlined into (and optimized with) its context
    trips = jax.lax.optimization_barrier(jnp.asarray(n_chunks, jnp.int32))
    _, _, ys = jax.lax.fori_loop(0, trips, body, (consts, (blocks, spare), out0))
    return jtu.tree_map(lambda y: y[:n_chunks].reshape((n,) + y.shape[2:]), ys)


# -- the registry -------------------------------------------------------------------------------

_REGISTRY: dict = {}


def register_strategy(name: str, cls: type) -> None:
    """Make the :class:`Strategy` subclass ``cls`` available by ``name`` (``sample_map=name``).

    :func:`get_strategy` then builds ``cls.create(devices, argname)``
    (:meth:`Strategy.create`). Registering a name again replaces it.

    Raises
    ------
    TypeError
        ``name`` is not a non-empty str or ``cls`` is not a Strategy subclass.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"cls must be a subclass of shardvi.parallel.Strategy, got {cls!r}")
    _REGISTRY[name] = cls


def strategy_names() -> tuple:
    """The registered strategy names, in registration order."""
    return tuple(_REGISTRY)


def strategy_class(name: str) -> type:
    """The :class:`Strategy` subclass registered as ``name`` (``ValueError`` if none is)."""
    if name not in _REGISTRY:
        raise ValueError(f"no strategy is registered as {name!r}; registered: {strategy_names()}")
    return _REGISTRY[name]


def get_strategy(spec, argname: str = "sample_map", devices=None, **options) -> Strategy:
    """Resolve a strategy name or object.

    Parameters
    ----------
    spec : str or Strategy
        A registered name (:func:`strategy_names`) or a strategy object.
    argname : str
        Argument name used in error messages.
    devices : sequence of jax.Device, optional
        Devices for strategies given by name (``None``: the strategy's
        default, all devices for the multi-device ones). With an object, only
        ``None`` or the object's own devices.
    **options
        Constructor options for a strategy given by name (every built-in
        takes ``chunk_size`` and ``reduce``).

    Raises
    ------
    TypeError
        ``spec`` is a strategy class rather than an instance, not a strategy,
        or an object whose ``map``/``mean`` fail or return wrong shapes on a
        small probe (traced with ``jax.eval_shape``: nothing is compiled);
        ``options`` given with a strategy object.
    ValueError
        Unknown name, or ``devices`` would be ignored: the one-device
        strategies (``"vmap"``, ``"lax_map"``) run on
        ``jax.local_devices()[0]`` and accept only ``None`` or exactly that
        device; a strategy object carries its own devices.
    """
    devices = check_devices(devices, "devices")
    if isinstance(spec, type):
        raise TypeError(
            f"{argname} is the class {spec.__name__}, not a strategy object: instantiate it, e.g. "
            f"{argname}={spec.__name__}() or {spec.__name__}(devices=...)"
        )
    if isinstance(spec, str):
        if spec not in _REGISTRY:
            raise ValueError(f"{argname} must be one of {strategy_names()} or a strategy object, got {spec!r}")
        return _REGISTRY[spec].create(devices, argname, **options)
    if options:
        raise TypeError(
            f"{argname}: options {sorted(options)} apply to a strategy given by name only; set them "
            f"on the {type(spec).__name__} object"
        )
    if isinstance(spec, Strategy):
        spec = spec.accept_devices(devices, argname)
        if not type(spec).__module__.startswith("shardvi.parallel"):
            _probe_strategy(spec, argname)
        return spec
    raise TypeError(
        f"{argname} must be a strategy name {strategy_names()} or a shardvi.parallel.Strategy "
        f"object (subclass it and implement map), got {type(spec).__name__}"
    )


_PROBE_SAMPLES = 8


def _probe_strategy(spec: Strategy, argname: str) -> None:
    """Trace ``map`` / ``mean`` / ``map_mean`` of a user's strategy on a tiny problem and check the shapes.

    A strategy that returns the wrong thing would otherwise fail deep inside
    the engine's compiled steps with a JAX-internal message.
    """
    inner = spec
    label = type(inner).__name__
    for attr in ("map", "mean"):
        if not callable(getattr(inner, attr, None)):
            raise TypeError(f"{argname}: {label}.{attr} must be callable")
    n = _PROBE_SAMPLES
    xs = jax.ShapeDtypeStruct((n, 2), jnp.float32)
    b = jax.ShapeDtypeStruct((2,), jnp.float32)

    def fn(x, y):
        return x * y

    def probe(x, y):
        stacked = spec.map(fn, (0, None))(x, y)
        # a user's map_mean may return anything: what it returns is what this probe checks
        return stacked, spec.mean(stacked), spec.map_mean(fn, (0, None))(x, y)  # pyright: ignore[reportCallIssue]

    try:
        stacked, mean, fused = jax.eval_shape(probe, xs, b)
    except Exception as err:  # reported with the argument's name
        raise TypeError(
            f"{argname}: the strategy object {label} failed on a probe (map of "
            f"x * y over {n} samples of shape (2,), then mean): {type(err).__name__}: {err}"
        ) from err
    expect = {
        "map(fn, in_axes)(...)": (stacked, (n, 2)),
        "mean(stacked)": (mean, (2,)),
        "map_mean(fn, in_axes)(...)": (fused, (2,)),
    }
    for what, (got, shape) in expect.items():
        if not isinstance(got, jax.ShapeDtypeStruct) or tuple(got.shape) != shape:
            desc = f"shape {tuple(got.shape)}" if isinstance(got, jax.ShapeDtypeStruct) else repr(got)
            raise TypeError(
                f"{argname}: {label}.{what} returned {desc} on a probe of {n} samples "
                f"of shape (2,); expected an array of shape {shape}"
            )


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
