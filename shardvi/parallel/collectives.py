"""Count cross-device collectives in compiled HLO (overall and inside loops).

>>> from shardvi.parallel import collectives
>>> c = collectives(jitted_fn, *args)
>>> c.total, c.in_loops, c.counts["all-gather"]
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType

import jax

__all__ = ["CollectiveCounts", "collectives", "count_collectives", "COLLECTIVE_OPS"]

#: HLO opcodes counted as collectives (async ``-start`` halves count once; ``-done`` is ignored).
COLLECTIVE_OPS = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)

_COMP_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?.*\{\s*$")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\(")
_CALLED = re.compile(r"(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_LOOP_PARTS = re.compile(r"(?:condition|body)=%?([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class CollectiveCounts:
    """Collectives of one compiled program.

    Attributes
    ----------
    counts : mapping str -> int
        Per opcode (``"all-reduce"``, ``"all-gather"``, ...), whole program.
    loop_counts : mapping str -> int
        Per opcode, only those inside a ``while`` loop's body or condition
        (or computations called from there), e.g. a solver's iteration.
    """

    counts: Mapping[str, int]
    loop_counts: Mapping[str, int]

    @property
    def total(self) -> int:
        """All collectives in the program."""
        return sum(self.counts.values())

    @property
    def in_loops(self) -> int:
        """Collectives executed inside loops (per iteration)."""
        return sum(self.loop_counts.values())

    @property
    def all_reduce(self) -> int:
        return self.counts["all-reduce"]

    @property
    def all_gather(self) -> int:
        return self.counts["all-gather"]

    def __str__(self):
        nz = {k: v for k, v in self.counts.items() if v}
        lz = {k: v for k, v in self.loop_counts.items() if v}
        return f"CollectiveCounts(total={self.total} {nz}, in_loops={self.in_loops} {lz})"


def _opcode(line: str):
    """The opcode of an HLO instruction line ``[ROOT] %name = type opcode(operands), attrs``."""
    if " = " not in line:
        return None
    m = _OPCODE.search(line.split(" = ", 1)[1])
    return m.group(1) if m else None


def _normalize(op: str | None):
    if op is None:
        return None
    base = op[:-6] if op.endswith("-start") else op
    if op.endswith("-done"):
        return None
    return base if base in COLLECTIVE_OPS else None


def count_collectives(hlo_text: str) -> CollectiveCounts:
    """Parse HLO text (``compiled.as_text()``) and count collective ops."""
    comps: dict = {}
    current = None
    for raw in hlo_text.splitlines():
        line = raw.strip()
        if current is None:
            m = _COMP_HEADER.match(line)
            if m and not line.startswith(("HloModule", "//")):
                current = m.group(2)
                comps[current] = []
            continue
        if line == "}":
            current = None
            continue
        comps[current].append(line)

    ops: dict = {}
    calls: dict = {}
    loop_roots: set = set()
    for name, lines in comps.items():
        ops[name], calls[name] = [], set()
        for line in lines:
            opcode = _opcode(line)
            op = _normalize(opcode)
            if op:
                ops[name].append(op)
            if opcode == "while":
                loop_roots.update(_LOOP_PARTS.findall(line))
            calls[name].update(_CALLED.findall(line))
            for b in _BRANCHES.findall(line):
                calls[name].update(x.strip().lstrip("%") for x in b.split(",") if x.strip())

    in_loop: set = set()
    stack = list(loop_roots)
    while stack:
        c = stack.pop()
        if c in in_loop or c not in comps:
            continue
        in_loop.add(c)
        stack.extend(calls.get(c, ()))

    counts = {op: 0 for op in COLLECTIVE_OPS}
    loop_counts = {op: 0 for op in COLLECTIVE_OPS}
    for name, found in ops.items():
        for op in found:
            counts[op] += 1
            if name in in_loop:
                loop_counts[op] += 1
    return CollectiveCounts(MappingProxyType(counts), MappingProxyType(loop_counts))


def collectives(fn, *args, **kwargs) -> CollectiveCounts:
    """Compile ``fn(*args, **kwargs)`` and count its collectives.

    Parameters
    ----------
    fn : callable
        A ``jax.jit``-ed function (its static arguments may be passed as
        keywords) or any function, which is then jitted.
    *args, **kwargs
        Example arguments (arrays or ``jax.ShapeDtypeStruct``).

    Returns
    -------
    CollectiveCounts
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    text = jitted.lower(*args, **kwargs).compile().as_text()
    return count_collectives(text)  # pyright: ignore[reportArgumentType] -- as_text() is a str on CPU/GPU/TPU
