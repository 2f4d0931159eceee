"""Device lists, 1-D sample meshes, shardings and the sample layout (padding).

Every multi-device strategy spreads the sample axis over a 1-D mesh with the
axis name :data:`SAMPLE_AXIS`. The *layout* of ``n`` samples on ``D`` devices
with ``c`` samples per vectorized chunk is fixed: the sample axis is padded to
``D * per_device`` entries with ``per_device`` the smallest multiple of ``c``
that holds ``ceil(n / D)`` samples; device ``d`` gets the contiguous block
``[d * per_device, (d + 1) * per_device)``. Every sample is therefore
evaluated in a chunk of exactly ``c`` samples at the same position within its
chunk, whatever ``D`` is; that is what makes the per-sample results bitwise
independent of the device count on XLA:CPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

__all__ = [
    "SAMPLE_AXIS",
    "MODEL_AXIS",
    "Layout",
    "check_devices",
    "sample_layout",
    "sample_mesh",
    "sample_model_mesh",
    "replicated",
    "sharded",
    "pad_samples",
]

SAMPLE_AXIS = "samples"
#: name of the mesh axis that splits the data blocks (the second axis of a strategy with ``model_shards``)
MODEL_AXIS = "model"


def check_devices(devices: Sequence | None, argname: str = "devices") -> tuple | None:
    """Validate a device list; ``None`` stays ``None`` (meaning all ``jax.devices()``).

    Raises
    ------
    TypeError
        ``devices`` is not a sequence of ``jax.Device`` (a single device, a
        string, a number, ...).
    ValueError
        The list is empty, has duplicates or mixes platforms (e.g. cpu and gpu).
    """
    if devices is None:
        return None
    if isinstance(devices, jax.Device):
        raise TypeError(
            f"{argname} must be a sequence of jax.Device, got a single device {devices}; pass [device] instead"
        )
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
        raise TypeError(
            f"{argname} must be a sequence of jax.Device (e.g. jax.devices()[:2]) or None, got {type(devices).__name__}"
        )
    devices = tuple(devices)
    if not devices:
        raise ValueError(
            f"{argname} is empty: pass at least one jax.Device (e.g. jax.devices()[:2]) or None for all devices"
        )
    for i, d in enumerate(devices):
        if not isinstance(d, jax.Device):
            raise TypeError(f"{argname}[{i}] must be a jax.Device, got {type(d).__name__} ({d!r})")
    platforms = sorted({d.platform for d in devices})
    if len(platforms) > 1:
        raise ValueError(
            f"{argname} mixes platforms {platforms}: all devices of one strategy must be on the same platform"
        )
    if len(set(devices)) != len(devices):
        raise ValueError(f"{argname} lists a device twice: {[str(d) for d in devices]}")
    return devices


def resolve_devices(devices: tuple | None) -> tuple:
    """``devices`` or, if ``None``, all (global) ``jax.devices()``."""
    return tuple(jax.devices()) if devices is None else tuple(devices)


def sample_mesh(devices: Sequence) -> Mesh:
    """1-D mesh over ``devices`` with the :data:`SAMPLE_AXIS` axis (``Auto`` axis type)."""
    return Mesh(np.asarray(devices, dtype=object), (SAMPLE_AXIS,), axis_types=(AxisType.Auto,))


def sample_model_mesh(devices: Sequence, model_shards: int) -> Mesh:
    """2-D mesh ``(len(devices) // model_shards, model_shards)`` with axes ``("samples", "model")``.

    Consecutive devices of ``devices`` form one row (one sample shard split over the model
    axis): in a multi-process run with devices in process order, the model axis stays within
    a process where ``model_shards`` divides the devices per process.
    """
    grid = np.asarray(devices, dtype=object).reshape(len(devices) // model_shards, model_shards)
    return Mesh(grid, (SAMPLE_AXIS, MODEL_AXIS), axis_types=(AxisType.Auto, AxisType.Auto))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device of ``mesh`` holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def sharded(mesh: Mesh) -> NamedSharding:
    """The leading (sample) axis is split over ``mesh``."""
    return NamedSharding(mesh, PartitionSpec(SAMPLE_AXIS))


class Layout(NamedTuple):
    """Placement of ``n`` samples: ``n_devices`` blocks of ``per_device`` samples."""

    n: int
    n_devices: int
    chunk: int
    per_device: int

    @property
    def padded(self) -> int:
        """Length of the padded sample axis (``n_devices * per_device``)."""
        return self.n_devices * self.per_device

    @property
    def n_chunks(self) -> int:
        """Vectorized chunks per device."""
        return self.per_device // self.chunk


def sample_layout(n: int, n_devices: int, chunk: int, pad: bool, strategy: str) -> Layout:
    """Layout of ``n`` samples; without ``pad`` an unplaceable count raises ``ValueError``.

    The error names ``n_samples`` (the user-facing argument) and lists the
    counts that work.
    """
    if n < 1:
        raise ValueError(f"{strategy}: cannot map over {n} samples (the sample axis must not be empty)")
    step = n_devices * chunk
    per_device = math.ceil(n / step) * chunk
    if not pad and n % step:
        ok = [step * k for k in range(1, 4)]
        raise ValueError(
            f"n_samples: {strategy} with pad=False cannot place {n} samples on {n_devices} device(s) with "
            f"chunk_size={chunk}: the length of every mapped sample axis must be a multiple of {step} "
            f"(= devices x chunk_size), e.g. {ok[0]}, {ok[1]}, {ok[2]}. With mirror_samples the sampling "
            f"maps one entry per pair (n_samples) and the KL two (2 * n_samples), so n_samples must be a "
            f"multiple of {step}. Or use pad=True (default) to pad with masked samples."
        )
    return Layout(n, n_devices, chunk, per_device)


def pad_samples(tree, n_padded: int):
    """Pad the leading axis of every leaf to ``n_padded`` by repeating the last sample.

    Copies of a real sample keep the padding entries finite (a zero key or a
    zero residual could be a singular input for some models); their results
    are dropped before anything is returned or averaged.
    """

    def one(x):
        extra = n_padded - x.shape[0]
        if extra == 0:
            return x
        return jnp.concatenate([x, jnp.repeat(x[-1:], extra, axis=0)], axis=0)

    return jtu.tree_map(one, tree)


def leading_size(args, in_axes, strategy: str) -> int:
    """Common leading-axis length of the mapped arguments (``ValueError`` if they disagree)."""
    sizes = set()
    for a, ax in zip(args, in_axes):
        if ax == 0:
            for leaf in jtu.tree_leaves(a):
                if jnp.ndim(leaf) == 0:
                    raise ValueError(f"{strategy}: a mapped argument has a scalar leaf (no sample axis)")
                sizes.add(int(jnp.shape(leaf)[0]))
    if len(sizes) != 1:
        raise ValueError(f"{strategy}: mapped arguments must share one sample-axis length, got {sorted(sizes)}")
    return sizes.pop()
