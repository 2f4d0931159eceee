"""A likelihood whose data are cut into fixed blocks: what ``amend(model, data_blocks=B)`` builds.

The data axis (length ``N``) of the likelihood's arrays and of the model's
``data_inputs`` is cut into ``B`` blocks of ``ceil(N / B)`` entries. Where
``B`` does not divide ``N`` the data are padded at the end with inert copies
of the last datum: every data-space term below is masked to exactly zero on
them (the energy is summed per datum with the padding left out), so they
change no sum, and each real datum keeps its global index. Everything the
engine needs on the latent space is a sum over blocks of per-block terms,

- energy ``H(xi) = sum_b H_b(s_b(xi))`` and its gradient,
- metric ``M t = sum_b J_b^T F_b J_b t``,
- metric sample ``J^T L e1 = sum_b J_b^T L_b e1_b`` with ``e1_b`` block ``b``'s
  part of the unblocked draw (each datum's noise from its global index),
- the geoVI map ``phi(r) = sum_b Jbar_b^T (x_b(pos + r) - x_b(pos))`` and its
  linearization (``x_b = T_b(s_b)``, ``Jbar_b`` its Jacobian at ``pos``),

computed by :func:`~shardvi.parallel.blocks.block_sum`: per block, in block
order, on one device as on many. A strategy with ``model_shards = k``
(``ShardMap`` or ``JitSharding(model_shards=k)``) places the blocks split over
its model mesh axis, so a device holds and evaluates ``B / k`` blocks of data, noise and
inputs and never another device's, and results are bitwise those of one
device for every ``k`` dividing ``B``.

These sums are not differentiated by JAX (the engine calls the operators
above); ``jax.grad`` of :meth:`BlockedLikelihood.energy` is not supported.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .. import tree_math as tm
from ..models.model import Model
from ..parallel.blocks import block_sum
from .diagnostics import _real_dof, chi2_sums
from .layout import WHOLE, Layout
from .likelihood import AmendedLikelihood, Likelihood, _check_model_matches_data, pulled_back_transformation_at
from .masks import project
from .samples import Samples

__all__ = ["BlockedLikelihood", "DataBlocks", "assemble_process_blocks"]


@dataclasses.dataclass(frozen=True)
class DataBlocks(Layout):
    """The data axis cut into ``n_blocks`` blocks (``amend(model, data_blocks=B)``); the latent stays whole.

    Latent-space operators are the likelihood's own sums over blocks (not
    differentiated by JAX); a model axis splits the blocks over devices.
    """

    name: ClassVar[str] = "data blocks"
    argument: ClassVar[str] = "data_blocks"
    splits_data: ClassVar[bool] = True

    @classmethod
    def amend(cls, likelihood, model, n_blocks):
        return BlockedLikelihood(likelihood, model, n_blocks)

    def model_sum(self, likelihood, fn, *args):
        # per block, in block order (where the blocks are: a model axis gathers the blocks' terms); the padding of
        # a last block that is not full is zero in the block's signal
        def one(blk, *a):
            return fn(lambda xi: likelihood._real(blk, likelihood._signal(blk, xi)), *a)

        return likelihood._sum(one, *args)

    def hamiltonian_and_grad(self, likelihood, xi):
        e, g = likelihood.energy_and_grad(xi)
        return e + 0.5 * tm.vdot(xi, xi), tm.add(g, xi)

    def chi2_sums(self, likelihood, pos, residuals, strategy):
        if not likelihood.has_chi2_sum:
            return WHOLE.chi2_sums(likelihood, pos, residuals, strategy)
        # each sample's chi^2 summed over the blocks where they are (the strategy's model axis)
        samples = Samples(pos, residuals)
        per_sample = strategy.map(lambda lik, x: lik.chi2_sum(x)[0], (None, 0))(likelihood, samples.samples)
        n = jtu.tree_leaves(samples.samples)[0].shape[0]
        return (jnp.sum(per_sample), n * likelihood.chi2_sum_dof), chi2_sums(samples)[1]


def _data_leaf(x, n: int, what: str):
    """``x`` unchanged if per datum (leading axis of length ``n``) or a scalar, else ``ValueError``.

    The arrays keep their data axis (no copy): the block view ``(B, N / B, ...)`` is
    taken inside the traced programs (:meth:`BlockedLikelihood._local_blocks`), where
    it is a free reshape of the device's own part.
    """
    shape = np.shape(x)
    if len(shape) and shape[0] != n:
        raise ValueError(
            f"{what} has an array of shape {shape}, neither per datum (leading axis of length {n}, the "
            f"data's) nor a scalar: it cannot be cut into data blocks"
        )
    return x


def _pad_rows(x, n_pad: int):
    """``x`` with ``n_pad`` copies of its last row appended (scalars unchanged): inert padding of the data axis."""
    if n_pad == 0 or np.ndim(x) == 0:
        return x
    xp = np if isinstance(x, np.ndarray) else jnp
    return xp.concatenate([x, xp.repeat(x[-1:], n_pad, axis=0)])


def _first_rows(tree, stop: int):
    """``tree`` with every per-datum leaf cut to its first ``stop`` rows (scalars unchanged)."""
    return jtu.tree_map(lambda x: x if np.ndim(x) == 0 else x[:stop], tree)


def _mask_rows(real, tree):
    """``tree`` with the rows where ``real`` is False set to zero (each leaf's leading axis is the block's data)."""

    def one(v):
        keep = jnp.reshape(real, real.shape + (1,) * (jnp.ndim(v) - 1))
        return jnp.where(keep, v, jnp.zeros_like(v))

    return jtu.tree_map(one, tree)


def _energy_per_datum(likelihood: Likelihood, s):
    """``(e_1, ..., e_n)``, the energy of each datum alone (``sum_i e_i = likelihood.energy(s)``).

    Every array of ``likelihood`` and of ``s`` has the data axis in front (or is a
    scalar, shared by all data): the likelihood of one datum is evaluated per datum.
    """
    leaves, treedef = jtu.tree_flatten(likelihood)
    per_datum = [np.ndim(x) > 0 for x in leaves]

    def one(rows, s_row):
        it = iter(rows)
        lik = jtu.tree_unflatten(treedef, [next(it)[None] if p else x for x, p in zip(leaves, per_datum)])
        return lik.energy(jtu.tree_map(lambda v: v[None], s_row))

    return jax.vmap(one)([x for x, p in zip(leaves, per_datum) if p], s)


def _check_per_datum(likelihood, model, inputs, size: int, data_blocks: int) -> None:
    """Padding sums the energy per datum: check on the first block that the datum terms add up to its energy.

    A likelihood whose energy couples the data of a block (e.g. a Gaussian with a callable noise operator
    that is not diagonal) would otherwise be summed wrongly; ``ValueError`` before any work.
    """
    lik = _first_rows(likelihood, size)
    xi = jtu.tree_map(lambda d: 0.1 * d, tm.random_like(jax.random.PRNGKey(0), model.domain))
    s = model.call(xi, _first_rows(inputs, size))
    whole = float(lik.energy(s))
    terms = np.asarray(_energy_per_datum(lik, s))
    eps = float(jnp.finfo(tm.leaf_dtype(model.domain)).eps)
    if not abs(whole - float(np.sum(terms))) <= 1e3 * eps * (abs(whole) + float(np.sum(np.abs(terms))) + 1.0):
        raise ValueError(
            f"data_blocks={data_blocks} does not divide the data, and the blocks would be padded: padding sums "
            f"the energy per datum, but {type(likelihood).__name__}'s energy of one block ({whole!r}) is not the "
            f"sum of its data's ({float(np.sum(terms))!r}), so it couples data: use a data_blocks that divides "
            "the number of data"
        )


class BlockedLikelihood(Likelihood):
    """``likelihood`` on the latent space of ``model``, its data cut into ``data_blocks`` blocks.

    Built by :meth:`Likelihood.amend` with ``data_blocks``; see the module
    docstring for the math and the reproducibility guarantee.

    Parameters
    ----------
    likelihood : Likelihood
        On the data space (``Gaussian``, ``Poisson``, ``StudentT``, ...): every
        array it holds has the data axis in front (length ``N``) or is a scalar.
    model : shardvi.Model
        Built with ``data_inputs`` (length ``N``); ``model.call(xi, inputs_block)``
        gives the predictions of one block.
    data_blocks : int
        Number of blocks ``B`` (any; where it does not divide ``N`` the data
        are padded with inert entries to ``B * ceil(N / B)``); a strategy's
        ``model_shards`` must divide it.

    Attributes
    ----------
    blocks : dict
        ``{"likelihood", "inputs", "index"}``: the likelihood's arrays and the
        model's inputs (per datum, leading axis ``B * block_size``, or scalars),
        and the block indices ``0..B-1``; with padding also ``"real"``, the
        boolean mask of the real data. A model-sharded strategy splits the
        leading axis of every non-scalar leaf over its model axis (``B / k``
        whole blocks per device). Without padding they are held as given (no
        copy); the block view ``(B, block_size, ...)`` is a reshape inside the
        programs.
    model : shardvi.Model
        The model without its ``data_inputs`` (replicated: the field's arrays).
    n_blocks, block_size, n_data : int
        ``B``, ``ceil(N / B)`` and ``N`` (the real data; ``B * block_size - N``
        of padding).
    data_domain : pytree of jax.ShapeDtypeStruct
        The shapes of the whole data (``likelihood.domain``).
    """

    def __init__(self, likelihood: Likelihood, model, data_blocks):
        if not isinstance(likelihood, Likelihood):
            raise TypeError(f"likelihood must be a shardvi Likelihood, got {type(likelihood).__name__}")
        if likelihood.layout != WHOLE or isinstance(likelihood, AmendedLikelihood):
            raise TypeError("amend a data-space likelihood (e.g. sv.Gaussian(...)), not one already amended")
        if not isinstance(model, Model):
            raise TypeError(f"model must be a shardvi.Model, got {type(model).__name__}")
        if isinstance(data_blocks, bool) or not isinstance(data_blocks, (int, np.integer)) or data_blocks < 1:
            raise ValueError(f"data_blocks must be a positive int, got {data_blocks!r}")
        data_blocks = int(data_blocks)
        if model.n_data is None:
            raise ValueError(
                "data_blocks needs a model built with data_inputs (sv.Model(call, domain, data_inputs=...), "
                "call(xi, inputs_block)): the engine evaluates the model block by block"
            )
        n = model.n_data
        data_lengths = {tuple(d.shape)[:1] for d in jtu.tree_leaves(likelihood.domain)}
        if data_lengths != {(n,)}:
            raise ValueError(
                f"data_inputs: their data axis has length {n}, but the likelihood's data have shapes "
                f"{[tuple(d.shape) for d in jtu.tree_leaves(likelihood.domain)]}: the leading axis of every "
                f"data array must be the data axis of data_inputs"
            )
        if data_blocks > n:
            raise ValueError(f"data_blocks={data_blocks} exceeds the {n} data: at most one block per datum")
        _check_model_matches_data(model, likelihood)
        size = -(-n // data_blocks)
        n_pad = size * data_blocks - n
        inputs = jtu.tree_map(lambda x: _pad_rows(_data_leaf(x, n, "data_inputs"), n_pad), model.data_inputs)
        blocked = jtu.tree_map(lambda x: _pad_rows(_data_leaf(x, n, type(likelihood).__name__), n_pad), likelihood)
        core = model._replaced(data_inputs=None)
        block_in = jtu.tree_map(lambda x: jax.ShapeDtypeStruct((size,) + np.shape(x)[1:], x.dtype), inputs)
        try:
            block_out = jax.eval_shape(model.call, model.domain, block_in)
        except Exception as err:  # the user's forward model on one block: say which call failed
            raise ValueError(
                f"model.call(xi, inputs_block) fails on one block of {size} data (inputs {block_in}): "
                f"{type(err).__name__}: {err}"
            ) from err
        want = jtu.tree_map(lambda d: ((size,) + tuple(d.shape)[1:], d.dtype), likelihood.domain)
        if jtu.tree_map(lambda s: (tuple(s.shape), s.dtype), block_out) != want:
            raise ValueError(
                f"model.call(xi, inputs_block) on a block of {size} data gives {block_out}, expected {want}: "
                f"the predictions of a block must have the block's data axis in front"
            )
        lsm = likelihood.lsm_tangents_shape
        if lsm is not None and any(tuple(d.shape)[:1] != (n,) for d in jtu.tree_leaves(lsm)):
            raise ValueError(
                f"the likelihood's metric square root acts on shapes {lsm}, not per datum: it cannot be blocked"
            )
        self.blocks = {"likelihood": blocked, "inputs": inputs, "index": np.arange(data_blocks, dtype=np.int32)}
        if n_pad:
            self.blocks["real"] = np.arange(size * data_blocks) < n
            _check_per_datum(likelihood, core, inputs, size, data_blocks)
        self.model = core
        self.n_blocks = data_blocks
        self.block_size = size
        self.n_data = n
        self.domain = model.domain
        self.lsm_tangents_shape = lsm
        self._block_lsm_shape = (
            None if lsm is None else jtu.tree_map(lambda d: jax.ShapeDtypeStruct((size,) + d.shape[1:], d.dtype), lsm)
        )
        self.data_domain = likelihood.domain
        self._has_transformation = likelihood.has_transformation
        self._has_normalized_residual = likelihood.has_normalized_residual
        # entries of the normalized residual per datum (a variable-covariance likelihood's signal is (mean, std):
        # twice the data's entries, its residual has the data's)
        out = likelihood.domain
        if likelihood.has_normalized_residual:
            out = jax.eval_shape(likelihood.normalized_residual, likelihood.domain)
        self._residual_per_datum = sum(math.prod(d.shape) for d in jtu.tree_leaves(out)) // n
        self._likelihood_type = type(likelihood).__name__

    def __repr__(self):
        pad = self.n_blocks * self.block_size - self.n_data
        return (
            f"BlockedLikelihood({self._likelihood_type}, {self.n_data} data in {self.n_blocks} blocks of "
            f"{self.block_size}{f' ({pad} padding)' if pad else ''}, model={self.model!r})"
        )

    @property
    def layout(self) -> DataBlocks:
        """The data cut into ``n_blocks`` blocks."""
        return DataBlocks(self.n_blocks)

    @property
    def data_likelihood(self) -> Likelihood:
        """The likelihood of the blocks' data (the data padded to whole blocks, inert where padded)."""
        return self.blocks["likelihood"]

    @property
    def padded(self) -> bool:
        """Whether the blocks end with inert padding (``data_blocks`` does not divide the data)."""
        return "real" in self.blocks

    # -- per block -----------------------------------------------------------------------------
    def _signal(self, blk, xi):
        return self.model.call(xi, blk["inputs"])

    def _x_at(self, blk, xi_bar):
        """``xi -> T_b(s_b(xi))``: block ``b``'s coordinates around ``s_b(xi_bar)`` (its ``transformation_at``)."""
        t = pulled_back_transformation_at(blk["likelihood"], lambda: self._signal(blk, xi_bar))
        return lambda xi: t(self._signal(blk, xi))

    def _local_blocks(self):
        """The blocks this device holds with a leading block axis: ``(b, N_local / b, ...)``; scalars ``(b,)``."""
        index = self.blocks["index"]
        n_local = index.shape[0]

        def view(x):
            if np.ndim(x) == 0:
                return jnp.broadcast_to(x, (n_local,))
            return jnp.reshape(x, (n_local, self.block_size) + tuple(np.shape(x)[1:]))

        rest = {k: v for k, v in self.blocks.items() if k != "index"}
        return jtu.tree_map(view, rest) | {"index": index}

    def _sum(self, fn, *broadcast):
        return block_sum(fn, self._local_blocks(), *broadcast)

    @staticmethod
    def _real(blk, tree):
        """``tree`` (the block's data-space vectors) with its padding zeroed; unchanged without padding."""
        return _mask_rows(blk["real"], tree) if "real" in blk else tree

    @staticmethod
    def _block_energy(blk, s):
        """``H_b(s_b)``, the energy of block ``b``'s real data."""
        if "real" not in blk:
            return blk["likelihood"].energy(s)
        return jnp.sum(_mask_rows(blk["real"], _energy_per_datum(blk["likelihood"], s)))

    # -- the operators -------------------------------------------------------------------------
    def normalization(self) -> float | None:
        """The data likelihood's (its leaves cut into blocks hold the same data; the padding left out)."""
        lik = self.blocks["likelihood"]
        if self.padded:
            lik = _first_rows(lik, self.n_data)
        return lik.normalization()

    def energy(self, xi):
        """``sum_b H_b(s_b(xi))``."""
        return self._sum(lambda blk, x: self._block_energy(blk, self._signal(blk, x)), xi)

    def energy_and_grad(self, xi):
        """``(H(xi), grad H(xi))``, each a sum over blocks (one reduction for both)."""
        return self._sum(
            lambda blk, x: jax.value_and_grad(lambda y: self._block_energy(blk, self._signal(blk, y)))(x), xi
        )

    def metric_operator(self, xi):
        """``t -> sum_b J_b^T F_b J_b t``; each application evaluates and linearizes the model per block."""

        def one(blk, x, t):
            s, jvp, adj = tm.linearize_with_adjoint(functools.partial(self._signal, blk), x)
            return adj(self._real(blk, blk["likelihood"].metric_operator(s)(jvp(t))))

        return lambda t: self._sum(one, xi, t)

    def left_sqrt_metric(self, xi, e):
        """``sum_b J_b^T L_b e1_b`` with ``e1_b`` white noise of block ``b``'s data: ``e`` is a *key*.

        The data-space noise is drawn on the blocks, each datum's from its global index
        (:func:`~shardvi.tree_math.random_like` with the block's first datum as row offset): the numbers
        the unblocked likelihood draws, for any number of blocks.
        """
        if self._block_lsm_shape is None:
            raise NotImplementedError(
                "this likelihood has neither a left_sqrt_metric nor a transformation (one is needed to draw samples)"
            )

        def one(blk, x, key):
            e1 = tm.random_like(key, self._block_lsm_shape, row_offset=blk["index"] * self.block_size)
            s, vjp = jax.vjp(functools.partial(self._signal, blk), x)
            return tm.linear_adjoint(vjp)(self._real(blk, blk["likelihood"].left_sqrt_metric(s, e1)))

        return self._sum(one, xi, e)

    def sampling_operators(self, xi):
        """``(key -> J^T L e1, t -> M t)`` (see :meth:`left_sqrt_metric`: the noise is drawn per block)."""
        return functools.partial(self.left_sqrt_metric, xi), self.metric_operator(xi)

    def _data_noise_sample(self, lsm, key):
        return lsm(key)

    def geovi_root(self, xi_bar, keep):
        """:meth:`Likelihood.geovi_root` with the blocks' operators (sums over blocks, not differentiated).

        The same root problem: ``delta(r) = r + phi(r) - y`` with ``phi`` of
        :meth:`geovi_operators`; gradient ``J_delta^T delta`` and Gauss-Newton
        ``J_delta^T J_delta`` from ``phi``'s linearization (restricted to the
        entries where ``keep`` is True).
        """
        phi, phi_jvp, phi_vjp = self.geovi_operators(xi_bar)
        lsm, _ = self.sampling_operators(xi_bar)

        def problem(y):
            def delta(r):
                r = project(keep, r)
                return project(keep, tm.sub(tm.add(r, phi(r)), y))

            def jac_t(r, w):  # J_delta(r)^T w
                w = project(keep, w)
                return project(keep, tm.add(w, phi_vjp(project(keep, r), w)))

            def jac(r, v):  # J_delta(r) v
                v = project(keep, v)
                return project(keep, tm.add(v, phi_jvp(project(keep, r), v)))

            def fun_and_grad(r):
                d = delta(r)
                return 0.5 * tm.vdot(d, d), jac_t(r, d)

            return fun_and_grad, lambda r, v: jac_t(r, jac(r, v)), None

        return lsm, problem

    def geovi_operators(self, pos):
        """``(phi, phi_jvp, phi_vjp)`` of the geoVI map ``phi(r) = Jbar^T (x(pos + r) - x(pos))``.

        ``phi_jvp(r, v) = Jbar^T J_x(pos + r) v`` and ``phi_vjp(r, w) = J_x(pos + r)^T Jbar w``,
        each a sum over blocks (``x = T(s)`` with ``T`` each block's ``transformation_at`` its signal at
        ``pos``, ``Jbar`` its Jacobian at ``pos``).
        """

        def phi(blk, p, r):
            xb = self._x_at(blk, p)
            x_bar, vjp = jax.vjp(xb, p)
            return tm.linear_adjoint(vjp)(self._real(blk, tm.sub(xb(tm.add(p, r)), x_bar)))

        def phi_jvp(blk, p, r, v):
            xb = self._x_at(blk, p)
            _, jv = jax.jvp(xb, (tm.add(p, r),), (v,))
            _, vjp = jax.vjp(xb, p)
            return tm.linear_adjoint(vjp)(self._real(blk, jv))

        def phi_vjp(blk, p, r, w):
            xb = self._x_at(blk, p)
            _, jw = jax.jvp(xb, (p,), (w,))
            _, vjp = jax.vjp(xb, tm.add(p, r))
            return tm.linear_adjoint(vjp)(self._real(blk, jw))

        return (
            lambda r: self._sum(phi, pos, r),
            lambda r, v: self._sum(phi_jvp, pos, r, v),
            lambda r, w: self._sum(phi_vjp, pos, r, w),
        )

    def transformation(self, xi):
        raise NotImplementedError(
            "a BlockedLikelihood's transformation lives on the blocked data (split over devices); the geoVI "
            "update uses geovi_operators"
        )

    def normalized_residual(self, xi):
        raise NotImplementedError(
            "a BlockedLikelihood's normalized residual lives on the blocked data (split over devices); use chi2_sum"
        )

    def chi2_sum(self, xi):
        """``(sum |r|^2 per real degree of freedom, dof)`` of the normalized residual, summed over blocks."""

        def one(blk, x):
            r = self._real(blk, blk["likelihood"].normalized_residual(self._signal(blk, x)))
            return sum(jnp.sum(jnp.abs(v) ** 2) / _real_dof(v) for v in jtu.tree_leaves(r))

        return self._sum(one, xi), self.chi2_sum_dof

    @property
    def chi2_sum_dof(self) -> int:
        """Entries of the normalized residual (the degrees of freedom of :meth:`chi2_sum`)."""
        return self._residual_per_datum * self.n_data

    @property
    def has_transformation(self) -> bool:
        return self._has_transformation

    @property
    def _lsm_from_transformation(self) -> bool:
        return False

    @property
    def has_normalized_residual(self) -> bool:
        return False

    @property
    def has_chi2_sum(self) -> bool:
        return self._has_normalized_residual

    @property
    def data_leaves(self):
        """The blocked data and noise, the inputs and the block count (checkpoint fingerprints)."""
        return {
            "blocked": {
                "likelihood": self.blocks["likelihood"].data_leaves,
                "inputs": self.blocks["inputs"],
                "data_blocks": np.asarray(self.n_blocks),
            }
        }


def assemble_process_blocks(local: BlockedLikelihood, strategy) -> BlockedLikelihood:
    """The blocked likelihood of all processes from each process's own blocks (multi-process model parallelism).

    In a multi-process run (:func:`~shardvi.parallel.initialize_distributed`) no
    process needs to load the data of the others: each builds ``local``, the
    likelihood of the blocks its devices hold along ``strategy``'s model axis
    (``sv.Gaussian(d_local, ...).amend(model_local, data_blocks=b_local)``, with
    the same block size everywhere), and this function joins them into one
    likelihood whose blocks are global arrays split over the model axis
    (``jax.make_array_from_process_local_data``). Process ``p`` must pass the
    blocks ``[m0 * B / k, m1 * B / k)`` of the whole data, ``[m0, m1)`` the
    model-axis positions of its devices; the result then equals (bitwise, in
    every computation) the likelihood of all data built in one process.

    Parameters
    ----------
    local : BlockedLikelihood
        This process's blocks.
    strategy : shardvi.parallel.ShardMap
        The strategy of the run, with ``model_shards`` dividing the block count.
    """
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from ..parallel.mesh import MODEL_AXIS

    if not isinstance(local, BlockedLikelihood):
        raise TypeError(f"local must be a BlockedLikelihood (amend(..., data_blocks=...)), got {type(local).__name__}")
    if local.padded:
        raise ValueError(
            f"local holds {local.n_data} data in {local.n_blocks} blocks of {local.block_size} (with padding): "
            "across processes every process's data must fill its blocks (choose each process's data_blocks "
            "dividing its number of data)"
        )
    k = getattr(strategy, "model_shards", 1)
    mesh = strategy.mesh
    if k == 1 or MODEL_AXIS not in mesh.axis_names:
        raise ValueError("strategy must split a model axis (e.g. ShardMap(model_shards=k) with k > 1)")
    me = jax.process_index()
    grid = np.asarray(mesh.devices)
    cols = sorted({c for (_, c), d in np.ndenumerate(grid) if d.process_index == me})
    if not cols or cols != list(range(cols[0], cols[-1] + 1)):
        raise ValueError(f"this process's devices hold model-axis positions {cols}: they must be one contiguous range")
    n_cols = len(cols)
    n_blocks = local.n_blocks * k // n_cols
    if local.n_blocks * k % n_cols:
        raise ValueError(f"local holds {local.n_blocks} blocks for {n_cols} of {k} model shards: not a whole share")
    first = cols[0] * n_blocks // k
    n = n_blocks * local.block_size
    split, whole_copy = NamedSharding(mesh, P(MODEL_AXIS)), NamedSharding(mesh, P())
    local_devices = [d for d in grid.flat if d.process_index == me]

    def glob(x, length):
        """The global array of which ``x`` is this process's part (a scalar: replicated)."""
        if np.ndim(x) == 0:
            return jax.make_array_from_process_local_data(whole_copy, np.asarray(x), ())
        shape = (length,) + tuple(np.shape(x)[1:])
        if len(local_devices) == 1 and isinstance(x, jax.Array) and x.devices() == {local_devices[0]}:
            return jax.make_array_from_single_device_arrays(shape, split, [x])  # the local buffer itself: no copy
        return jax.make_array_from_process_local_data(split, np.asarray(x), shape)

    blocks = {
        "likelihood": jtu.tree_map(lambda x: glob(x, n), local.blocks["likelihood"]),
        "inputs": jtu.tree_map(lambda x: glob(x, n), local.blocks["inputs"]),
        "index": glob(np.asarray(local.blocks["index"]) + first, n_blocks),
    }

    def whole(d):
        return jax.ShapeDtypeStruct((n,) + tuple(d.shape)[1:], d.dtype)

    lsm = local.lsm_tangents_shape
    return local._replaced(
        blocks=blocks,
        n_blocks=n_blocks,
        n_data=n,
        data_domain=jtu.tree_map(whole, local.data_domain),
        lsm_tangents_shape=None if lsm is None else jtu.tree_map(whole, lsm),
    )
