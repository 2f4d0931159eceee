"""A likelihood whose data and field are split into slabs: what ``amend(model, field_blocks=B)`` builds.

Field parallelism. The data are pixel-wise on a grid (every data leaf has the
grid's rows, ``N0``, along its first axis) and the latent leaves with the
grid's shape (a correlated field's excitations) live on the same grid. Both
are cut into ``B`` fixed blocks of rows (:class:`~shardvi.parallel.grid.GridLayout`);
a strategy with ``model_shards = k`` (``k`` dividing ``B``) gives each device
of a model row ``B / k`` blocks, a slab.

Per device the engine works on a :meth:`FieldSplitLikelihood.per_device`
view: latent vectors hold :class:`~shardvi.parallel.grid.Slab` leaves (the
device's rows), the data are the device's rows, the model computes the
device's slab of the field (a :class:`~shardvi.CorrelatedField` does, with the
slab transform), and every sum over the grid — the energy, inner products and
norms in CG and Newton-CG, the random draws — is taken per block and combined
in block order (:mod:`shardvi.parallel.grid`). The solvers therefore iterate
identically, and results are bitwise equal, on one device and on any mesh
whose ``model_shards`` divides ``B``.

In the engine's own programs the latents keep their rows split too
(:func:`split_latent`): with ``model_shards = k > 1`` every grid leaf of the
position and the residuals is a :class:`~shardvi.parallel.grid.MeshSlab`,
placed with its rows split over the model axis; the strategy hands each
device its rows and returns the per-device slabs split, and the KL's
Newton-CG, whose vectors are these, reduces over them per block in a
``shard_map`` (the same block-order sums). No device ever holds a whole
grid-shaped latent; the data's grid rows are split the same way
(:meth:`FieldSplitLikelihood.partition_specs`).

Used directly (outside the engine's per-device work) the likelihood takes and
returns whole latent arrays like any other; on one device (or outside a model
axis) the slab is the whole grid.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu
from jax.sharding import PartitionSpec as P

from .. import tree_math as tm
from ..models.harmonic import RegularGrid
from ..models.responses import UNOBSERVED, pixel_responses_recorded, pixels_on_grid
from ..parallel.blocks import MODEL_AXIS, current_model_axis
from ..parallel.field_arrays import holds_global, is_global
from ..parallel.grid import (
    GridLayout,
    MeshSlab,
    Slab,
    block_map,
    block_total,
    gather_rows,
    is_mesh_slab,
    is_slab,
    local_rows,
    normal_at,
    pad_rows,
    unpad_rows,
)
from ..parallel.strategy import ordered_sum
from .layout import WHOLE, Layout
from .likelihood import AmendedLikelihood, Likelihood

__all__ = [
    "FieldRows",
    "FieldSplitLikelihood",
    "per_device",
    "whole",
    "split_latent",
    "padded_latent",
    "unpadded_latent",
    "field_split_chi2_sums",
    "one_zero_residual",
]


@dataclasses.dataclass(frozen=True)
class FieldRows(Layout):
    """The data and the field's grid cut into ``n_blocks`` blocks of rows (``amend(model, field_blocks=B)``).

    Attributes
    ----------
    grid_shapes : frozenset of tuple
        The shapes of the grid: latent leaves of one of these shapes have their
        rows split with the data's.
    rows : int or None
        The grid's ``N0`` where ``n_blocks`` does not divide it (the blocks end with
        padding rows), else ``None``.
    """

    grid_shapes: frozenset = frozenset()
    rows: int | None = None

    name: ClassVar[str] = "blocks of grid rows"
    argument: ClassVar[str] = "field_blocks"
    splits_latent: ClassVar[bool] = True

    @classmethod
    def amend(cls, likelihood, model, n_blocks):
        return FieldSplitLikelihood(likelihood, model, n_blocks)

    def latent_split(self, domain):
        return jtu.tree_map(lambda d: tuple(d.shape) in self.grid_shapes, domain)

    def require(self, what: str) -> None:
        raise NotImplementedError(
            f"{what} does not take a likelihood amended with field_blocks yet: amend it without field_blocks "
            "(or, for data that need not be on the grid, with data_blocks)"
        )

    def needs_row_check(self, model_shards: int) -> bool:
        # padding rows: a model that moves rows (a flip) would move them into the grid, also on one device
        return model_shards > 1 or self.rows is not None

    def hamiltonian_and_grad(self, likelihood, xi):
        return WHOLE.hamiltonian_and_grad(likelihood, xi)  # per device, on the device's view and slabs

    def chi2_sums(self, likelihood, pos, residuals, strategy):
        return field_split_chi2_sums(likelihood, pos, residuals, strategy)


def _grid_rows(likelihood: Likelihood) -> int:
    """``N0``: the common first-axis length of the likelihood's data leaves (``ValueError`` otherwise)."""
    shapes = [tuple(d.shape) for d in jtu.tree_leaves(likelihood.domain)]
    rows = {s[0] for s in shapes if len(s) >= 2}
    if len(rows) != 1 or any(len(s) < 2 for s in shapes):
        raise ValueError(
            f"field_blocks needs pixel-wise data on a grid of at least 2 axes (every data leaf with the "
            f"grid's rows along axis 0), got data shapes {shapes}"
        )
    return rows.pop()


class FieldSplitLikelihood(AmendedLikelihood):
    """``likelihood`` on the latent space of ``model``, data and field cut into ``field_blocks`` slabs.

    Built by :meth:`Likelihood.amend <shardvi.Likelihood.amend>` with ``field_blocks``;
    see the module docstring.

    Parameters
    ----------
    likelihood : Likelihood
        Pixel-wise on the grid (``Gaussian``, ``Poisson``, ``StudentT``, ...): its
        array leaves have the grid's rows along axis 0 (or are scalars). Or the
        data of the model's one ``sv.Mask`` / ``sv.Sampling``: as its output
        vector, or on its grid (arrays of the grid's shape, any value at the
        pixels it does not read; split over processes, each builds its rows).
    model : shardvi.Model
        Its output matches the data; its latent leaves with the data's grid shape
        are split with the data (the rest, e.g. hyperparameters, is replicated).
        It must compute a slab of its output from a latent with
        :class:`~shardvi.parallel.grid.Slab` leaves (a
        :class:`~shardvi.CorrelatedField` and element-wise operations on it do).
    field_blocks : int
        ``B``, at most the grid's rows ``N0``; a strategy's ``model_shards`` must
        divide it. Where ``B`` does not divide ``N0`` the blocks hold
        ``ceil(N0 / B)`` rows each and end with padding rows after the grid's:
        unobserved in the data, zero in every latent (their random numbers too),
        not read by the slab transform; the whole-latent methods take and
        return the grid's own rows (:meth:`unpadded_latent`).
    """

    def __init__(self, likelihood: Likelihood, model, field_blocks: int):
        # the data of a Mask / Sampling given on its grid (each process may hold only its rows)
        given_on_grid = _response_of_grid_data(likelihood, model)
        if given_on_grid is None:
            super().__init__(likelihood, model)
        else:  # checked against the model as the data in the response's layout
            super().__init__(_as_response_data(likelihood, given_on_grid), model)
        if isinstance(field_blocks, bool) or not isinstance(field_blocks, (int, np.integer)) or field_blocks < 1:
            raise ValueError(f"field_blocks must be an int >= 1, got {field_blocks!r}")
        # data of a Mask / Sampling of the field: held on the grid, unobserved pixels ignored
        self.observed = self.response = self.datum_index = None
        self.data_domain = self.likelihood.domain  # the data as given (for the chi^2's degrees of freedom)
        response = given_on_grid or _find_pixel_response(likelihood, model)
        if response is not None:
            flat, grid_shape = response.pixel_indices(), tuple(response.shape)
            observed = np.zeros(math.prod(grid_shape), bool)
            observed[flat.ravel()] = True
            self.observed = _host_grid(observed, grid_shape)
            # the datum each pixel holds (-1: none): its noise is the unsplit run's number of that datum
            index = np.full(math.prod(grid_shape), -1, np.int32 if flat.size < 2**31 else np.int64)
            index[flat.ravel()] = np.arange(flat.size)
            self.datum_index = _host_grid(index, grid_shape)
            if given_on_grid is None:
                likelihood = _likelihood_on_grid(likelihood, flat, grid_shape)
            else:
                likelihood = _unobserved_ignored(likelihood, self.observed)
            self.response = response
            self.likelihood = likelihood
        rows = _grid_rows(likelihood)
        if int(field_blocks) > rows:
            raise ValueError(
                f"field_blocks={field_blocks} exceeds the grid's {rows} rows (axis 0 of the data): every block "
                f"holds at least one row of the grid"
            )
        grid = {tuple(d.shape) for d in jtu.tree_leaves(likelihood.domain)}
        lsm = likelihood.lsm_tangents_shape
        if lsm is not None and any(np.shape(d)[:1] != (rows,) for d in jtu.tree_leaves(lsm)):
            raise ValueError(
                "field_blocks needs a likelihood whose metric square root acts on grid-shaped noise "
                f"(lsm_tangents_shape with {rows} rows along axis 0), got {lsm}"
            )
        self.n_blocks = int(field_blocks)
        self.data_rows = rows
        # blocks that do not divide the rows: padding rows after the grid's (unobserved data, zero latent)
        pad = GridLayout(self.n_blocks, rows=rows) if rows % self.n_blocks else None
        if pad is not None:
            _check_no_global_arrays(likelihood, model, self.n_blocks, rows)
            if self.observed is None:
                self.observed = _host_grid(np.ones(_common_grid(likelihood), bool), None)
            self.observed = _host_grid(np.asarray(pad_rows(self.observed, pad, value=False)), None)
            if self.datum_index is not None:
                self.datum_index = _host_grid(np.asarray(pad_rows(self.datum_index, pad, value=-1)), None)
            likelihood = _padded_likelihood(likelihood, pad)
            self.likelihood = likelihood
            rows = int(pad.padded_rows or rows)
        self.grid_rows = rows
        # static: which of the likelihood's leaves hold the grid's rows (split over a model axis with the field)
        self.data_split = tuple(np.ndim(a) >= 1 and np.shape(a)[0] == rows for a in jtu.tree_leaves(likelihood))
        self.grid_shapes = frozenset(grid)
        # static: which latent leaves are split with the data (those with a data grid's shape)
        self.latent_split = self.layout.latent_split(model.domain)
        # static: which of the model's leaves hold the grid's rows and are read row by row (a correlated
        # field's power index): split over a model axis like the data (no whole copy on every device)
        self.model_split = _row_local_model_leaves(model, grid if pad is None else set())  # padded: whole
        stray = [x.shape for x, s in zip(jtu.tree_leaves(model), self.model_split) if is_global(x) and not s]
        if stray:
            raise ValueError(
                f"field_blocks: the model holds arrays split over processes (shapes {stray}) that are not the power "
                f"index of a grid of the data's shape {sorted(grid)}: only those are read row by row "
                f"(sv.parallel.field_model splits them); build the others whole"
            )

    @property
    def padding_rows(self) -> int:
        """Rows appended to the grid's so that ``n_blocks`` blocks of equal rows hold it (0 where it divides)."""
        return self.grid_rows - self.data_rows

    @property
    def layout(self) -> FieldRows:
        """The data and the grid cut into ``n_blocks`` blocks of rows."""
        return FieldRows(self.n_blocks, self.grid_shapes, self.blocks_layout().rows)

    def blocks_layout(self, axis: str | None = None, shards: int = 1) -> GridLayout:
        """The :class:`~shardvi.parallel.grid.GridLayout` of the blocks over ``shards`` devices along ``axis``."""
        return GridLayout(self.n_blocks, axis, shards, self.data_rows if self.padding_rows else None)

    def grid_layout(self) -> GridLayout:
        """The grid's layout being traced under: the strategy's model axis, or all blocks local."""
        axis = current_model_axis()
        if axis is None or axis.size == 1:
            return self.blocks_layout()
        if self.n_blocks % axis.size:
            raise ValueError(
                f"model_shards={axis.size} does not divide field_blocks={self.n_blocks}: every device of "
                f"a model row holds the same number of whole blocks"
            )
        return self.blocks_layout(axis.name, axis.size)

    def unpadded_latent(self, tree):
        """Latents (optionally with leading sample axes) with the padding rows of their grid leaves cut off."""
        return _latent_rows(self, tree, unpad_rows)

    def one_block(self) -> FieldSplitLikelihood:
        """This likelihood with its data and grid in one block (no padding rows): the reference the check of
        a padded layout compares with (:func:`~shardvi.vi.row_locality.check_row_local`)."""
        return FieldSplitLikelihood(_unpadded_likelihood(self), self.model, 1)

    def partition_specs(self, axis: str):
        """A ``PartitionSpec`` per leaf: ``P(axis)`` for the data's grid rows, the observed pixels, their data
        indices and the model's row-local grid leaves (a correlated field's power index), else ``P()``."""
        flags = {"likelihood": iter(self.data_split), "model": iter(self.model_split)}
        flat = []
        for path, _ in jtu.tree_flatten_with_path(self)[0]:
            name = path[0].name if isinstance(path[0], jtu.GetAttrKey) else None
            split = next(flags[name]) if name in flags else name in ("observed", "datum_index")
            flat.append(P(axis) if split else P())
        return jtu.tree_unflatten(jtu.tree_structure(self), flat)

    def per_device(self, layout: GridLayout | None = None) -> _DeviceView:
        """The likelihood as one device of the model axis sees it (latent with ``Slab`` leaves)."""
        return _DeviceView(self, self.grid_layout() if layout is None else layout)

    # whole latent arrays in and out (the per-device view inside)
    def energy(self, xi):
        v = self.per_device()
        return v.energy(v.local(xi))

    def normalization(self) -> float | None:
        """The data likelihood's: of the grid's data, or of the data a ``Mask`` / ``Sampling`` reads (its arrays
        on the grid read through the response, the unobserved pixels left out). ``None`` where the data are split
        over processes (no process holds them whole) or the data likelihood does not know it."""
        likelihood = _unpadded_likelihood(self)
        if holds_global(likelihood):
            return None
        response = self.response
        if response is None:
            return likelihood.normalization()
        grid = tuple(response.shape)
        return jtu.tree_map(lambda x: response(x) if np.shape(x) == grid else x, likelihood).normalization()

    def _to_data(self, tree):
        """Grid-shaped data-space arrays -> the data's own layout: padding rows cut off, the Mask / Sampling
        applied to them."""
        tree = jtu.tree_map(lambda x: unpad_rows(x, self.blocks_layout()), tree)
        response = self.response
        return tree if response is None else jtu.tree_map(response, tree)

    def _from_data(self, tree):
        """Data-space arrays in the data's layout -> grid-shaped: the response's adjoint (zero elsewhere), zero
        padding rows."""
        response = self.response
        tree = tree if response is None else jtu.tree_map(response.adjoint, tree)
        return jtu.tree_map(lambda x: pad_rows(x, self.blocks_layout()), tree)

    def _latent_whole(self, tree):
        """Per-device latent slabs -> whole latent arrays without padding rows."""
        return self.unpadded_latent(whole(tree))

    def transformation(self, xi):
        v = self.per_device()
        return self._to_data(whole(v.transformation(v.local(xi))))

    def transformation_at(self, xi_bar):
        v = self.per_device()
        t = v.transformation_at(v.local(xi_bar))
        return lambda xi: self._to_data(whole(t(v.local(xi))))

    def metric_operator(self, xi):
        v = self.per_device()
        op = v.metric_operator(v.local(xi))
        return lambda t: self._latent_whole(op(v.local(t)))

    def left_sqrt_metric(self, xi, e):
        v = self.per_device()
        return self._latent_whole(v.left_sqrt_metric(v.local(xi), v.local_data(self._from_data(e))))

    def sampling_operators(self, xi):
        v = self.per_device()
        lsm, metric = v.sampling_operators(v.local(xi))
        return (
            (lambda e: self._latent_whole(lsm(v.local_data(self._from_data(e))))),
            (lambda t: self._latent_whole(metric(v.local(t)))),
        )

    def _data_noise_sample(self, lsm, key):
        """The per-device draw (each datum's number on its pixel), handed to ``lsm`` in the data's own layout."""
        return self.per_device()._data_noise_sample(lambda e: lsm(self._to_data(whole(e))), key)

    def normalized_residual(self, xi):
        v = self.per_device()
        return self._to_data(whole(v.normalized_residual(v.local(xi))))


class _DeviceView(AmendedLikelihood):
    """One device's view of a :class:`FieldSplitLikelihood`: ``Slab`` leaves in and out.

    Built while tracing (no validation); ``domain`` and ``lsm_tangents_shape`` are
    the local ones, with ``Slab`` leaves, so the sampling and KL code draw and
    reduce over the whole grid in block order.
    """

    def __init__(self, parent: FieldSplitLikelihood, layout: GridLayout):
        rows = parent.grid_rows // layout.shards

        def split_sds(d):
            return Slab(jax.ShapeDtypeStruct((rows,) + tuple(d.shape[1:]), d.dtype), layout)

        self.parent = parent
        self.layout_ = layout
        leaves, treedef = jtu.tree_flatten(parent.likelihood)
        self.likelihood = jtu.tree_unflatten(
            treedef, [Slab(self._rows(a), layout) if s else a for a, s in zip(leaves, parent.data_split)]
        )
        # the device's rows of the observed pixels (data of a Mask / Sampling), None: every pixel
        self.observed = None if parent.observed is None else self._rows(parent.observed)
        self.datum_index = None if parent.datum_index is None else self._rows(parent.datum_index)
        out_shapes = tuple((rows,) + tuple(d.shape[1:]) for d in jtu.tree_leaves(parent.likelihood.domain))
        # padding rows without a Mask / Sampling: the model's output there (a zero latent's) is not data
        unobserved = self.observed if parent.padding_rows and parent.response is None else None
        self.model = functools.partial(
            _slab_model, parent.model, layout, self.observed, out_shapes, parent.model_split, unobserved
        )
        self.domain = jtu.tree_map(lambda d, s: split_sds(d) if s else d, parent.domain, parent.latent_split)
        lsm = parent.likelihood.lsm_tangents_shape
        self.lsm_tangents_shape = None if lsm is None else jtu.tree_map(split_sds, lsm)

    def _rows(self, a):
        """The device's rows of a grid-shaped array: ``a`` itself when it holds them already (split by the
        strategy's in-specs, :meth:`FieldSplitLikelihood.partition_specs`), else cut from the whole grid."""
        layout = self.layout_
        return local_rows(a, layout) if layout.shards > 1 and np.shape(a)[0] == self.parent.grid_rows else a

    def local(self, xi):
        """Latent arrays -> the device's slabs at the split leaves.

        A whole array is cut to the device's rows; a :class:`~shardvi.parallel.grid.MeshSlab`
        (split by the strategy) holds them already; a ``Slab`` is kept.
        """

        def one(x, s):
            if is_mesh_slab(x):
                return Slab(x.value, self.layout_)
            if is_slab(x) or not s:
                return x
            return Slab(local_rows(pad_rows(x, self.layout_), self.layout_), self.layout_)

        return jtu.tree_map(one, xi, self.parent.latent_split, is_leaf=is_slab)

    def local_data(self, e):
        """Whole data-shaped arrays -> the device's slabs."""
        return jtu.tree_map(
            lambda x: x if is_slab(x) else Slab(local_rows(x, self.layout_), self.layout_), e, is_leaf=is_slab
        )

    def _data_noise_sample(self, lsm, key):
        """``lsm`` of standard-normal data noise: per pixel of the grid, or, for the data of a Mask / Sampling,
        per datum on the pixel it observes (the unsplit run's numbers, :func:`~shardvi.parallel.grid.normal_at`)."""
        index = self.datum_index
        if index is None:
            return lsm(tm.random_like(key, self.lsm_tangents_shape))
        leaves, treedef = jtu.tree_flatten(self.lsm_tangents_shape, is_leaf=is_slab)
        keys = jax.random.split(key, max(len(leaves), 1))  # per leaf, as tm.random_like
        layout = self.layout_
        draws = [Slab(normal_at(k, index, d.value.dtype, layout), layout) for k, d in zip(keys, leaves)]
        return lsm(jtu.tree_unflatten(treedef, draws))

    def energy(self, xi):
        """The data likelihood's energy of each block of the grid, added over all blocks in block order.

        The pixel-wise likelihood's own ``energy`` runs on one block of rows at a time (its data
        and the model's output cut to the block), so a likelihood that sums with ``jnp.sum``
        (``Poisson``, ``StudentT``, ...) gives the whole-grid energy, bitwise the same on every
        layout, instead of this device's part of it.
        """
        return block_energy(self.likelihood, self.model(xi), self.layout_, self.observed)

    def normalized_residual(self, xi):
        r, observed = super().normalized_residual(xi), self.observed
        if observed is None:
            return r
        return jtu.tree_map(lambda x: jnp.where(_expanded(observed, x), x, jnp.zeros((), x.dtype)), r)


def block_energy(likelihood: Likelihood, s, layout: GridLayout, observed=None):
    """``likelihood.energy(s)`` of a pixel-wise likelihood whose data and ``s`` hold ``Slab`` leaves.

    Per block: the likelihood rebuilt from the block's rows of its ``Slab`` leaves (the others
    as they are) evaluated at the block's rows of ``s``; the per-block energies are added in
    block order over the model axis (:func:`~shardvi.parallel.grid.block_map`). With
    ``observed`` (boolean, the local rows of the grid) only the observed pixels count: the
    energy of each pixel (the likelihood of that pixel alone, vectorized over the block) is
    summed where ``observed`` holds.
    """
    lh_leaves, lh_def = jtu.tree_flatten(likelihood, is_leaf=is_slab)
    s_leaves, s_def = jtu.tree_flatten(s, is_leaf=is_slab)
    at = [i for i, x in enumerate(lh_leaves) if is_slab(x)]
    if not all(is_slab(x) for x in s_leaves):
        raise TypeError("internal: the model's output on a field-split latent must be slabs")

    def rebuilt(blocks):
        leaves = list(lh_leaves)
        for i, b in zip(at, blocks):
            leaves[i] = b
        return jtu.tree_unflatten(lh_def, leaves)

    def one(*blocks):
        lh_b, s_b = blocks[: len(at)], jtu.tree_unflatten(s_def, list(blocks[len(at) : len(at) + len(s_leaves)]))
        if observed is None:
            return rebuilt(lh_b).energy(s_b)
        seen = blocks[-1]

        def pixel(lh_px, s_px):  # one pixel's energy: every grid-shaped leaf at that pixel
            return rebuilt(lh_px).energy(s_px)

        flat = lambda a: a.reshape((-1,) + a.shape[seen.ndim :])  # noqa: E731 -- the block's pixels in a row
        terms = jax.vmap(pixel)([flat(b) for b in lh_b], jtu.tree_map(flat, s_b))
        return jnp.sum(jnp.where(seen.reshape(-1), terms, jnp.zeros((), terms.dtype)))

    slabs = [lh_leaves[i].value for i in at] + [x.value for x in s_leaves]
    if observed is not None:
        slabs.append(observed)
    return block_total(block_map(one, layout, *slabs), layout)


def _slab_model(model, layout: GridLayout, observed, out_shapes, model_split, unobserved, xi):
    """The model on a latent with ``Slab`` leaves, its (pixel-wise) output as slabs.

    With ``observed`` (the device's rows of the observed pixels) the model's Mask / Sampling returns
    its input on the grid (:func:`~shardvi.models.responses.pixels_on_grid`). ``out_shapes``:
    the device's rows of the data grid, per output leaf; ``model_split``: which of the model's
    leaves may hold the device's rows only (:func:`_row_local_model_leaves`); ``unobserved``: the
    device's rows of the grid's own pixels where the output elsewhere (padding rows) is replaced by
    :data:`~shardvi.models.responses.UNOBSERVED`, or ``None``. A model whose output on the device's
    rows has other shapes (or that fails there) needs the whole field: under a model axis that
    allows it (``JitSharding``) it is evaluated on the whole field, gathered on every device of
    the axis (:func:`_whole_model`); else ``ValueError``.
    """
    try:
        out = _call_on_grid(model, xi, observed)
        failure = None
    except (TypeError, ValueError) as err:
        if layout.shards == 1:
            raise
        out, failure = None, (err, f"fails there ({type(err).__name__}: {err})")
    if failure is None:
        got = tuple(tuple(np.shape(o)) for o in jtu.tree_leaves(out))
        if got == out_shapes:
            if unobserved is not None:
                out = jtu.tree_map(
                    lambda o: jnp.where(_expanded(unobserved, o), o, jnp.asarray(UNOBSERVED, o.dtype)), out
                )
            return jtu.tree_map(lambda s: Slab(s, layout), out)
        failure = (None, f"gives output shapes {list(got)}")
    axis = current_model_axis()
    if axis is not None and axis.whole_model and layout.rows is None:
        warnings.warn(
            f"field_blocks: the model needs the whole field (on one device's rows of the grid it "
            f"{failure[1]}); it is evaluated on the whole field, gathered on each of the {layout.shards} devices "
            f"of the model axis (the field's memory and the model's work are not split)",
            UserWarning,
            stacklevel=2,
        )
        whole_model = _gathered_leaves(model, model_split, layout, out_shapes[0][0])
        return _whole_model(whole_model, layout, observed, out_shapes, xi)
    raise ValueError(_whole_field_message(layout, out_shapes, failure[1])) from failure[0]


def _expanded(mask, x):
    """``mask`` (the leading axes of ``x``) with trailing axes of length 1 to broadcast against ``x``."""
    return mask.reshape(mask.shape + (1,) * (np.ndim(x) - mask.ndim))


def _call_on_grid(model, xi, observed):
    """``model(xi)``, its Mask / Sampling returning its input on the grid where ``observed`` is given.

    A model that applies array operations to a grid leaf of ``xi`` itself (instead of passing it to a
    correlated field, which reads its rows) fails on the ``Slab`` it receives: ``ValueError`` naming the leaf.
    """
    try:
        if observed is None:
            return model(xi)
        with pixels_on_grid(observed):
            return model(xi)
    except TypeError as err:
        if "Slab" not in str(err):
            raise
        paths = [
            jtu.keystr(p) or "the latent" for p, x in jtu.tree_flatten_with_path(xi, is_leaf=is_slab)[0] if is_slab(x)
        ]
        raise ValueError(
            f"field_blocks: the latent leaves of the grid's shape ({', '.join(paths)}) are split into blocks of rows, "
            f"which only a correlated field reads (sv.CorrelatedFieldMaker: its excitations); the model applies an "
            f"operation to one directly ({err}). Make the grid-shaped latents the excitations of a correlated field, "
            f"give other latents a shape other than the grid's, or amend without field_blocks"
        ) from None


def _whole_model(model, layout: GridLayout, observed, out_shapes, xi):
    """The model on the whole field, every device of the axis the same, cut to the device's rows.

    The slabs are gathered into the whole grid (one device's layout: all blocks local) and
    the model computes what it computes on one device, on every device of the axis; the
    output's rows are cut out. Each is linear with the other as transpose (the replicated
    cotangent in between is the whole one), so gradients and the metric are the one-device
    ones, bitwise. Costs the whole field's memory and compute on every device.
    """
    one = GridLayout(layout.blocks)
    whole_xi = jtu.tree_map(lambda x: Slab(gather_rows(x.value, layout), one) if is_slab(x) else x, xi, is_leaf=is_slab)
    out = _call_on_grid(model, whole_xi, None if observed is None else gather_rows(observed, layout))
    grid = tuple((s[0] * layout.shards,) + s[1:] for s in out_shapes)
    got = tuple(tuple(np.shape(o)) for o in jtu.tree_leaves(out))
    if got != grid:
        raise ValueError(
            f"field_blocks: the model's output on the whole field has shapes {list(got)}, expected the data "
            f"grid's {list(grid)}"
        )
    return jtu.tree_map(lambda o: Slab(local_rows(o, layout), layout), out)


def _row_local_model_leaves(model, grid_shapes) -> tuple:
    """Per leaf of ``model``: whether it is the power index of a :class:`~shardvi.models.harmonic.RegularGrid`
    of one of the data grid's shapes (read row by row by the correlated field's slab path, which takes it
    whole or as the device's rows). Other grid-shaped leaves stay whole: how the model reads them is unknown."""
    is_grid = lambda n: isinstance(n, RegularGrid)  # noqa: E731
    grids = [g for g in jtu.tree_leaves(model, is_leaf=is_grid) if is_grid(g)]
    index = {id(g.power_index) for g in grids if g.shape in grid_shapes}
    return tuple(id(leaf) in index for leaf in jtu.tree_leaves(model))


def _gathered_leaves(model, model_split, layout: GridLayout, local_rows_n: int):
    """``model`` with its split leaves that hold the device's ``local_rows_n`` rows only (split by the
    strategy's in-specs) gathered whole over the model axis; whole ones kept."""
    if layout.shards == 1:
        return model
    leaves, treedef = jtu.tree_flatten(model)
    return jtu.tree_unflatten(
        treedef,
        [gather_rows(x, layout) if s and x.shape[0] == local_rows_n else x for x, s in zip(leaves, model_split)],
    )


def _whole_field_message(layout: GridLayout, out_shapes, what: str) -> str:
    return (
        f"field_blocks: the model must act on the field row block by row block, but on one device's rows of the "
        f"grid (its {layout.local_blocks} of {layout.blocks} blocks, split over {layout.shards} devices) it "
        f"{what}; expected the device's rows of the data grid, shapes {list(out_shapes)}. An operation that "
        f"needs the whole field (a reshape, transpose or sum across the grid's first axis) cannot run with "
        f"the field split over ShardMap's model axis: use JitSharding (which evaluates such a model on the "
        f"whole field, gathered on every device of the model axis), model_shards=1, or amend the likelihood "
        f"without field_blocks"
        + (
            ""
            if layout.rows is None
            else f" (JitSharding gathers the field only where field_blocks divides the grid's {layout.rows} rows)"
        )
    )


def _recorded_responses(model) -> list:
    """The distinct Mask / Sampling objects the model calls, recorded while tracing it once."""
    with pixel_responses_recorded() as found:  # a new function: a trace JAX cached earlier would record nothing
        jax.eval_shape(lambda xi: model(xi), model.domain)
    return list({id(r): r for r in found}.values())


def _find_pixel_response(likelihood: Likelihood, model):
    """The model's one Mask / Sampling of a field of >= 2 axes (reading each pixel at most once) when the
    data are its output; ``None`` when the data are on a grid already; else ``ValueError``."""
    shapes = [tuple(d.shape) for d in jtu.tree_leaves(likelihood.domain)]
    if len({s[0] for s in shapes if len(s) >= 2}) == 1 and all(len(s) >= 2 for s in shapes):
        return None
    responses = _recorded_responses(model)
    need = (
        "field_blocks needs pixel-wise data on a grid of at least 2 axes (every data leaf with the grid's rows "
        "along axis 0), or the data of one sv.Mask or sv.Sampling of the field in the model"
    )
    if len(responses) != 1:
        raise ValueError(f"{need}; got data shapes {shapes} and {len(responses)} Mask/Sampling calls in the model")
    resp = responses[0]
    try:
        flat = resp.pixel_indices()
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        raise ValueError(f"{need}: the {type(resp).__name__}'s pixels must be concrete (close over it)") from None
    grid = tuple(resp.shape)
    if len(grid) < 2:
        raise ValueError(f"{need}; the {type(resp).__name__} reads a field of shape {grid} (1 axis)")
    if any(s != flat.shape for s in shapes):
        raise ValueError(
            f"{need}: every data leaf must have the {type(resp).__name__}'s output shape {flat.shape}, got {shapes}"
        )
    if np.unique(flat).size != flat.size:
        raise ValueError(
            f"{need}: the {type(resp).__name__} reads some pixels more than once; with field_blocks each datum "
            f"must be one pixel of its own"
        )
    return resp


def _response_of_grid_data(likelihood: Likelihood, model):
    """The model's one Mask / Sampling when the likelihood's data are given on its grid (every data leaf of the
    grid's shape, or a scalar) while the model returns the response's output; else ``None``."""
    shapes = {tuple(d.shape) for d in jtu.tree_leaves(likelihood.domain) if len(d.shape)}
    targets = {tuple(d.shape) for d in jtu.tree_leaves(model.target)}
    if len(shapes) != 1 or len(next(iter(shapes))) < 2 or shapes == targets:
        return None
    responses = _recorded_responses(model)
    if len(responses) != 1 or {tuple(responses[0].shape)} != shapes:
        return None
    try:
        flat = responses[0].pixel_indices()
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None
    if targets != {tuple(flat.shape)} or np.unique(flat).size != flat.size:
        return None
    return responses[0]


def _as_response_data(likelihood: Likelihood, response) -> Likelihood:
    """``likelihood`` (data on the response's grid) described as data in the response's output layout: what the
    model's output is checked against (its arrays are not used)."""
    out = tuple(np.shape(response.pixel_indices()))
    domain = jtu.tree_map(lambda d: jax.ShapeDtypeStruct(out, d.dtype), likelihood.domain)
    lsm = likelihood.lsm_tangents_shape
    if lsm is not None:
        lsm = jtu.tree_map(lambda d: jax.ShapeDtypeStruct(out, d.dtype), lsm)
    return likelihood._replaced(domain=domain, lsm_tangents_shape=lsm)


def _unobserved_ignored(likelihood: Likelihood, observed: np.ndarray) -> Likelihood:
    """``likelihood`` (data given on the grid) with :data:`~shardvi.models.responses.UNOBSERVED` where
    ``observed`` (the grid of pixels the response reads) is False, whatever was given there. An array split over
    processes stays split: each process replaces its own rows."""
    grid_shape = observed.shape

    def one(x):
        if np.ndim(x) == 0:
            return x
        if tuple(np.shape(x)) != tuple(grid_shape):
            raise ValueError(
                f"field_blocks with the data of a Mask / Sampling given on its grid {tuple(grid_shape)}: the "
                f"likelihood's array of shape {np.shape(x)} is neither on the grid nor a scalar"
            )
        if is_global(x):
            mask = jax.make_array_from_callback(grid_shape, x.sharding, lambda index: observed[index])
            keep = jax.jit(lambda a, m: jnp.where(m, a, jnp.asarray(UNOBSERVED, a.dtype)), out_shardings=x.sharding)
            return keep(x, mask)
        x = np.asarray(x)
        return _host_grid(np.where(observed, x, np.asarray(UNOBSERVED, x.dtype)), grid_shape)

    return jtu.tree_map(one, likelihood)


def _host_grid(a: np.ndarray, grid_shape) -> np.ndarray:
    """``a`` as a read-only host array of ``grid_shape`` (``None``: its own): the strategy places its rows on
    each device, no whole-grid copy lands on the default device."""
    a = a.reshape(a.shape if grid_shape is None else grid_shape)
    a.setflags(write=False)
    return a


def _likelihood_on_grid(likelihood: Likelihood, flat, grid_shape):
    """``likelihood`` with its per-datum leaves scattered onto the grid (1 at unobserved pixels), held on the
    host."""
    data_shape = flat.shape
    leaves, treedef = jtu.tree_flatten(likelihood)

    def on_grid(x):
        if np.ndim(x) == 0:
            return x
        if np.shape(x) != data_shape:
            raise ValueError(
                f"field_blocks with the data of a Mask / Sampling: the likelihood's array of shape {np.shape(x)} "
                f"is neither per datum {data_shape} nor a scalar"
            )
        if is_global(x):
            raise ValueError(
                "field_blocks with the data of a Mask / Sampling: the data are split over processes "
                "(sv.parallel.field_array), but the data of a Mask / Sampling are scattered onto the grid on "
                "every process: give them whole (only data on the grid, one value per pixel, can be split)"
            )
        x = np.asarray(x)
        g = np.full(math.prod(grid_shape), UNOBSERVED, jax.dtypes.canonicalize_dtype(x.dtype))
        g[flat.ravel()] = x.ravel()
        return _host_grid(g, grid_shape)

    grid = jtu.tree_unflatten(treedef, [on_grid(x) for x in leaves])
    domain = jtu.tree_map(lambda d: jax.ShapeDtypeStruct(grid_shape, d.dtype), likelihood.domain)
    lsm = likelihood.lsm_tangents_shape
    if lsm is not None:
        lsm = jtu.tree_map(lambda d: jax.ShapeDtypeStruct(grid_shape, d.dtype), lsm)
    return grid._replaced(domain=domain, lsm_tangents_shape=lsm)


def _common_grid(likelihood: Likelihood) -> tuple:
    """The leading axes all of the likelihood's data leaves share (the grid's pixels)."""
    shapes = [tuple(d.shape) for d in jtu.tree_leaves(likelihood.domain)]
    n = 0
    while all(len(s) > n and s[n] == shapes[0][n] for s in shapes):
        n += 1
    return shapes[0][:n]


def _padded_likelihood(likelihood: Likelihood, pad: GridLayout) -> Likelihood:
    """``likelihood`` with the padding rows of ``pad`` appended to every array with the grid's rows along axis 0
    (:data:`~shardvi.models.responses.UNOBSERVED`: finite, and not data), held on the host."""
    assert pad.rows is not None and pad.padded_rows is not None
    return _rows_changed(likelihood, pad.rows, pad.padded_rows, lambda a: pad_rows(a, pad, value=UNOBSERVED))


def _unpadded_likelihood(lh: FieldSplitLikelihood) -> Likelihood:
    """The data likelihood of ``lh`` on the grid (``lh.likelihood``) without its padding rows."""
    if not lh.padding_rows:
        return lh.likelihood
    layout = lh.blocks_layout()
    return _rows_changed(lh.likelihood, lh.grid_rows, lh.data_rows, lambda a: unpad_rows(a, layout))


def _rows_changed(likelihood: Likelihood, rows: int, new_rows: int, fn) -> Likelihood:
    """``likelihood`` with ``fn`` applied to every array with ``rows`` rows along axis 0 (held on the host), its
    domain and metric square root's tangents with ``new_rows`` rows."""

    def one(x):
        if np.ndim(x) == 0 or np.shape(x)[0] != rows:
            return x
        return _host_grid(np.asarray(fn(np.asarray(x))), None)

    def sds(d):
        return jax.ShapeDtypeStruct((new_rows,) + tuple(d.shape[1:]), d.dtype)

    lsm = likelihood.lsm_tangents_shape
    return jtu.tree_map(one, likelihood)._replaced(
        domain=jtu.tree_map(sds, likelihood.domain), lsm_tangents_shape=None if lsm is None else jtu.tree_map(sds, lsm)
    )


def _check_no_global_arrays(likelihood: Likelihood, model, n_blocks: int, rows: int) -> None:
    """``ValueError`` where arrays split over processes meet blocks that do not divide the rows."""
    if holds_global((likelihood, model)):
        divisors = [b for b in range(1, rows + 1) if rows % b == 0]
        raise ValueError(
            f"field_blocks={n_blocks} does not divide the grid's {rows} rows, and the data or the model hold "
            f"arrays split over processes (sv.parallel.field_array / field_model), whose rows the blocks must "
            f"divide: use a divisor of {rows} (one of {divisors})"
        )


def whole(tree):
    """``Slab`` leaves gathered into whole arrays over the model axis (other leaves unchanged)."""
    return jtu.tree_map(lambda x: gather_rows(x.value, x.layout) if is_slab(x) else x, tree, is_leaf=is_slab)


def per_device(lh, *latents):
    """``(view, latents...)``: the per-device view of a field-split likelihood and its latents as slabs.

    Any other likelihood and its latents are returned unchanged.
    """
    if not isinstance(lh, FieldSplitLikelihood):
        return (lh, *latents)
    v = lh.per_device()
    return (v, *(v.local(x) for x in latents))


def split_latent(lh, strategy, tree):
    """``tree`` (latents, optionally with leading sample axes) with the grid leaves of a field-split ``lh`` marked.

    What the engine hands its compiled steps: a :class:`~shardvi.parallel.grid.MeshSlab` per
    grid leaf when ``strategy`` splits the field over a model axis (``model_shards > 1``:
    placed with its rows split, never whole on one device), else a ``Slab`` of the whole grid
    (one device: the same block-order reductions). Any other likelihood: ``tree`` unchanged.
    """
    if not isinstance(lh, FieldSplitLikelihood):
        return tree
    tree = padded_latent(lh, tree)  # padding rows appended (where the blocks have them)
    k = getattr(strategy, "model_shards", 1)
    if k == 1:
        layout = lh.blocks_layout()
        return jtu.tree_map(lambda x, s: Slab(x, layout) if s else x, tree, lh.latent_split)
    if lh.n_blocks % k:
        raise ValueError(
            f"model_shards={k} does not divide field_blocks={lh.n_blocks}: every model shard holds the same "
            f"number of whole blocks of grid rows"
        )
    layout, mesh = lh.blocks_layout(MODEL_AXIS, k), strategy.mesh
    return jtu.tree_map(
        lambda x, s, d: MeshSlab(x, layout, mesh, len(d.shape)) if s else x, tree, lh.latent_split, lh.domain
    )


def padded_latent(lh, tree):
    """Latents (whole arrays, optionally with leading sample axes) with the padding rows of a field-split ``lh``
    whose blocks have them appended (zero; those that have them kept); any other ``tree`` unchanged."""
    return _latent_rows(lh, tree, pad_rows) if isinstance(lh, FieldSplitLikelihood) else tree


def unpadded_latent(lh, tree):
    """Latents returned by the engine's programs (whole arrays, optionally with leading sample axes) without the
    padding rows of a field-split ``lh`` whose blocks have them; any other ``tree`` unchanged."""
    return lh.unpadded_latent(tree) if isinstance(lh, FieldSplitLikelihood) else tree


def _latent_rows(lh: FieldSplitLikelihood, tree, fn):
    """``fn(leaf, layout, axis)`` (:func:`~shardvi.parallel.grid.pad_rows` / ``unpad_rows``) on the grid
    leaves of ``tree``, ``axis`` their grid's first axis (after any leading sample axes)."""
    if not lh.padding_rows:
        return tree
    layout = lh.blocks_layout()

    def one(x, s, d):
        if not s or is_slab(x):
            return x
        return fn(x, layout, np.ndim(x) - len(d.shape))

    return jtu.tree_map(one, tree, lh.latent_split, lh.domain, is_leaf=is_slab)


def one_zero_residual(pos):
    """A stack of one zero residual shaped like ``pos`` (slab nodes kept): the samples of a run without any."""
    return jtu.tree_map(lambda x: jnp.zeros((1, *x.shape), x.dtype), pos)


def field_split_chi2_sums(lh: FieldSplitLikelihood, pos, residuals, strategy):
    """:func:`~shardvi.vi.diagnostics.chi2_sums` of a field-split likelihood, each sample's sums per device.

    ``pos`` and ``residuals`` as the engine passes them (:func:`split_latent`). Per sample:
    the squared normalized residual (zero at unobserved pixels) and the squared latent,
    summed over the grid in block order; the samples' sums are then added in sample order.
    The same bits on every layout.
    """

    def one(lik, p, r):
        lik, p, r = per_device(lik, p, r)
        x = tm.add(p, r)
        nr = lik.normalized_residual(x) if lh.has_normalized_residual else {}
        return _pooled_squares(nr), _pooled_squares(x)

    n = jtu.tree_leaves(residuals)[0].shape[0]
    if n == 0:  # no samples: the sums at pos (as Samples.samples)
        residuals, n = one_zero_residual(pos), 1
    lik_sums, prior_sums = strategy.map(one, (None, None, 0))(lh, pos, residuals)
    data = sum(math.prod(d.shape) for d in jtu.tree_leaves(lh.data_domain))
    lik = (ordered_sum(lik_sums), n * data) if lh.has_normalized_residual else None
    return lik, (ordered_sum(prior_sums), n * tm.size(pos))


def _pooled_squares(tree):
    """``sum |x|^2`` per real degree of freedom (halved for complex leaves), leaf by leaf (slabs in block order)."""
    parts = []
    for x in jtu.tree_leaves(tree, is_leaf=is_slab):
        dtype = x.value.dtype if is_slab(x) else x.dtype
        parts.append(tm.vdot(x, x) / (2 if jnp.issubdtype(dtype, jnp.complexfloating) else 1))
    return sum(parts[1:], parts[0]) if parts else jnp.zeros(())
