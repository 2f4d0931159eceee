"""How a likelihood is cut over a device map's model axis: one :class:`Layout` object per likelihood.

Every likelihood carries one (``likelihood.layout``): :data:`WHOLE` for data
and field in one piece, :class:`~shardvi.vi.blocked.DataBlocks` for
``amend(model, data_blocks=B)`` (the data axis cut into ``B`` blocks) and
:class:`~shardvi.vi.field_split.FieldRows` for ``amend(model,
field_blocks=B)`` (the data and the field's grid cut into ``B`` blocks of
rows). The engine, the Wiener filter, the evidence, the planner, the memory
check and the strategies ask the layout what is cut and how; none of them
looks at the likelihood's class. A new layout is one new subclass (in the
module of the likelihood that carries it).

A layout says

- what is cut: :attr:`Layout.splits_data`, :attr:`Layout.splits_latent`
  (which latent leaves, :meth:`Layout.latent_split`), into how many blocks
  (:attr:`Layout.n_blocks`, :attr:`Layout.model_blocks`);
- what a device holds (:meth:`Layout.latent_bytes_per_device`) and whether a
  strategy fits it (:meth:`Layout.check_model_shards`);
- how the latent-space operators are computed (:meth:`Layout.hamiltonian_and_grad`,
  :meth:`Layout.chi2_sums`);
- what it does not support yet (:meth:`Layout.require`) and whether the
  model must be checked before a run (:meth:`Layout.needs_row_check`).

Random numbers never depend on the layout: every datum's and pixel's draw is a
function of its global index, so a split run draws what the unsplit run does.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
from jax import tree_util as jtu

from .. import tree_math as tm
from .diagnostics import chi2_sums
from .samples import Samples

__all__ = ["Layout", "Whole", "WHOLE", "hamiltonian"]


def hamiltonian(likelihood, xi):
    """``H(xi) = likelihood.energy(xi) + xi.xi / 2`` (latent prior N(0, I))."""
    return likelihood.energy(xi) + 0.5 * tm.vdot(xi, xi)


@dataclasses.dataclass(frozen=True)
class Layout(abc.ABC):
    """How a likelihood's data, latent grid and sums are cut over a model axis (an extension point).

    Attributes
    ----------
    n_blocks : int
        The blocks the data (or the grid's rows) are cut into; 1 for a whole
        likelihood. A strategy's ``model_shards`` must divide it.
    """

    n_blocks: int = 1

    #: what a block is, in messages ("data blocks")
    name: ClassVar[str] = "layout"
    #: the argument of ``amend`` that builds this layout
    argument: ClassVar[str] = ""
    #: the data are cut into blocks that a model axis splits over devices
    splits_data: ClassVar[bool] = False
    #: grid-shaped latent leaves are cut into row blocks that a model axis splits over devices
    splits_latent: ClassVar[bool] = False

    #: the layouts ``Likelihood.amend`` builds, by their ``argument`` (every subclass that names one)
    _by_argument: ClassVar[dict] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("argument"):
            Layout._by_argument[cls.argument] = cls

    @classmethod
    def for_argument(cls, argument: str) -> type[Layout]:
        """The layout class that ``amend(model, <argument>=B)`` builds (``data_blocks``, ``field_blocks``)."""
        try:
            return Layout._by_argument[argument]
        except KeyError:
            raise ValueError(f"no layout is built by amend(..., {argument}=...)") from None

    @classmethod
    def amend(cls, likelihood, model, n_blocks):
        """``likelihood`` on the latent space of ``model``, cut by this layout into ``n_blocks`` blocks."""
        raise NotImplementedError(f"{cls.__name__} is not built by Likelihood.amend")

    @property
    def model_blocks(self) -> int | None:
        """The blocks a model axis may split (``None``: nothing to split, one model shard only)."""
        return self.n_blocks if (self.splits_data or self.splits_latent) else None

    def latent_split(self, domain):
        """``domain``'s structure with ``True`` where a latent leaf's rows are split over a model axis."""
        return jtu.tree_map(lambda _: False, domain)

    def latent_bytes_per_device(self, domain, model_shards: int) -> int:
        """Bytes one latent vector of ``domain`` occupies on a device of a model axis with ``model_shards``."""
        total = 0
        for d, split in zip(jtu.tree_leaves(domain), jtu.tree_leaves(self.latent_split(domain)), strict=True):
            nbytes = int(d.size) * d.dtype.itemsize
            total += -(-nbytes // max(model_shards, 1)) if split else nbytes
        return total

    def check_model_shards(self, model_shards: int) -> None:
        """``ValueError`` unless ``model_shards`` divides the blocks (every shard holds the same whole blocks)."""
        blocks = self.model_blocks
        if blocks is not None and blocks % model_shards:
            raise ValueError(
                f"model_shards={model_shards} does not divide {self.argument}={blocks}: every model shard holds "
                f"the same number of whole {self.name} (amend with a multiple of {model_shards}, or use "
                f"model_shards dividing {blocks})"
            )

    def require(self, what: str) -> None:
        """Raise ``NotImplementedError`` if the entry point ``what`` does not support this layout."""
        return None

    def needs_row_check(self, model_shards: int) -> bool:
        """Whether the model must be shown to respect the cut before a run with ``model_shards``."""
        return False

    def model_sum(self, likelihood, fn, *args):
        """``sum_parts fn(signal, *args)`` with ``signal`` the model of each part this layout cuts the data into
        (``xi -> s``; the whole model where the data are whole), summed as this layout sums (a pytree of arrays).

        E.g. a norm over the whole signal space from per-part squared norms, without assembling the signal.
        """
        return fn(likelihood.model, *args)

    @abc.abstractmethod
    def hamiltonian_and_grad(self, likelihood, xi) -> tuple:
        """``(H(xi), dH/dxi)`` with ``H = energy + |xi|^2 / 2``, computed as this layout computes sums."""

    @abc.abstractmethod
    def chi2_sums(self, likelihood, pos, residuals, strategy) -> tuple:
        """``((chi^2 sum, dof) of the likelihood or None, (chi^2 sum, dof) of the prior)`` over ``pos + r_i``.

        ``pos`` and ``residuals`` as the engine passes them to its steps.
        """


@dataclasses.dataclass(frozen=True)
class Whole(Layout):
    """Data and field in one piece: the default of every likelihood; a model axis has nothing to split."""

    name: ClassVar[str] = "whole"

    def hamiltonian_and_grad(self, likelihood, xi):
        return jax.value_and_grad(hamiltonian, argnums=1)(likelihood, xi)

    def chi2_sums(self, likelihood, pos, residuals, strategy):
        return chi2_sums(Samples(pos, residuals), likelihood)


#: the layout of a likelihood that is not cut
WHOLE = Whole()
