"""Saving and loading checkpoints: arrays in ``state-NNNNNN.npz``, metadata in the index."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings

import jax.numpy as jnp
import numpy as np
from jax import tree_util as jtu

from .._checks import check_bool
from ..diagnostics import IterationReport
from ..samples import Samples
from ..state import OptimizeVIState, check_nit, raw_key
from .files import _INDEX, FORMAT, CheckpointError, _atomic_write, _on_host, _sha256, _structure, check_path
from .fingerprints import _fingerprint_differences
from .index import _owned_files, _read_index, _validate_index, check_fingerprint
from .lock import checkpoint_lock

__all__ = ["save_checkpoint", "load_checkpoint", "has_checkpoint"]

logger = logging.getLogger("shardvi")

_KEEP = 2


def save_checkpoint(directory, samples: Samples, state: OptimizeVIState, *, fingerprint: dict | None = None) -> str:
    """Write ``samples`` and an ``OptimizeVIState`` to ``directory``; returns the npz path.

    Holds the directory's lock while writing (re-entrant: a run that holds it
    keeps it). The arrays go to ``state-NNNNNN.npz`` (``NNNNNN = state.nit``),
    then the index ``latest.json`` is replaced. The index lists the npz files
    of this run (inherited from the index it replaces); only those older than
    the newest two are deleted: other files in ``directory`` are never
    touched.

    Parameters
    ----------
    directory : str or os.PathLike
    samples : Samples
    state : OptimizeVIState
    fingerprint : dict, optional
        From :func:`fingerprint`; checked by :func:`load_checkpoint`.

    Raises
    ------
    TypeError
        ``samples`` is not a :class:`~shardvi.Samples`, ``state`` not an
        :class:`~shardvi.OptimizeVIState`, ``state.nit`` not an int,
        ``state.key`` not one threefry key, ``fingerprint`` neither ``None``
        nor a dict of JSON values.
    ValueError
        ``state.nit`` is negative; ``fingerprint`` does not have the layout
        of :func:`fingerprint`'s result; the index would not load back (e.g.
        ``state.history`` holds records :func:`load_checkpoint` refuses).
    CheckpointError
        The directory cannot be created or written.

    Notes
    -----
    Every argument, and the index to be written, is checked with the rules
    :func:`load_checkpoint` reads it with before the directory is created or
    any file is written. If writing fails, the arrays of this call are
    removed unless a file of that name was there before: the previous
    checkpoint stays the one the index names.
    """
    if not isinstance(samples, Samples):
        raise TypeError(f"samples must be a shardvi.Samples, got {type(samples).__name__}")
    if not isinstance(state, OptimizeVIState):
        raise TypeError(
            f"state must be an OptimizeVIState (e.g. from OptimizeVI.init_state), got {type(state).__name__}"
        )
    check_nit(state.nit, "state.nit")
    state_key = np.asarray(raw_key(state.key, "state.key"))
    d = check_path(directory, "directory")
    fingerprint = check_fingerprint(fingerprint, "fingerprint")
    name = f"state-{int(state.nit):06d}.npz"
    meta = {
        "format": FORMAT,
        "nit": int(state.nit),
        "npz": name,
        "sha256": "0" * 64,  # the digest of the arrays, once written
        "structure": _structure(samples.pos),
        "n_residuals": len(samples),
        "history": [r._asdict() for r in state.history],
        "files": [name],
        "fingerprint": fingerprint,
    }
    _check_index(meta)
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as err:
        raise CheckpointError(f"checkpoint directory {d!r} cannot be created: {err.strerror or err}") from err
    arrays = {}
    for i, x in enumerate(jtu.tree_leaves(samples.pos)):
        arrays[f"pos_{i}"] = _on_host(x)
    for i, x in enumerate(jtu.tree_leaves(samples.residuals)):
        arrays[f"residuals_{i}"] = _on_host(x)
    keys = samples.keys if samples.keys is not None else np.zeros((0, 2), np.uint32)
    arrays["keys"] = np.asarray(keys)
    arrays["state_key"] = state_key
    path = os.path.join(d, name)
    with checkpoint_lock(d):
        existed = os.path.lexists(path)
        written = False
        try:
            owned = [f for f in _owned_files(d) if f != name] + [name]
            _atomic_write(path, lambda f: np.savez(f, **arrays))
            written = True
            meta.update(sha256=_sha256(path), files=owned[-_KEEP:])
            text = json.dumps(meta, indent=1).encode()
            # the old ones go first: the index on disk names a kept file, never a pruned one
            for f in owned[:-_KEEP]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(d, f))
            _atomic_write(os.path.join(d, _INDEX), lambda f: f.write(text))
        except BaseException as err:
            if written and not existed:
                with contextlib.suppress(OSError):
                    os.unlink(path)  # no index names these arrays
            if isinstance(err, OSError):
                raise CheckpointError(
                    f"writing the checkpoint of iteration {state.nit} to {d!r} failed: {err.strerror or err}"
                ) from err
            raise
    return path


def _check_index(meta: dict) -> None:
    """``ValueError`` unless ``meta``, written as JSON, passes the checks :func:`load_checkpoint` reads it with."""
    try:
        text = json.dumps(meta)
    except (TypeError, ValueError, RecursionError) as err:
        raise ValueError(f"state.history cannot be written as JSON: {err}") from None
    try:
        _validate_index(json.loads(text), "latest.json")
    except CheckpointError as err:
        raise ValueError(f"save_checkpoint would write an index that load_checkpoint refuses: {err}") from None


def has_checkpoint(directory) -> bool:
    """Whether ``directory`` holds a checkpoint index (valid or not: :func:`load_checkpoint` checks)."""
    return directory is not None and os.path.lexists(os.path.join(os.fsdecode(os.fspath(directory)), _INDEX))


def _read_arrays(directory: str, meta: dict, like_pos):
    path = os.path.join(directory, meta["npz"])
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint arrays {path!r} are a directory, not a file")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint arrays {path!r} are missing")
    try:
        digest = _sha256(path)
    except OSError as err:
        raise CheckpointError(f"checkpoint arrays {path!r} are unreadable: {err.strerror or err}") from None
    if digest != meta["sha256"]:
        raise CheckpointError(f"checkpoint arrays {path!r} do not match their recorded SHA-256 (corrupted)")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except Exception as err:  # noqa: BLE001 -- zipfile/format errors, object arrays (pickle)
        raise CheckpointError(f"checkpoint arrays {path!r} are unreadable: {err}") from None

    def bad(msg):
        return CheckpointError(f"checkpoint arrays {path!r} do not match the index: {msg}")

    leaves = meta["structure"]["leaves"]
    n = len(leaves)
    expected = {f"pos_{i}" for i in range(n)} | {f"residuals_{i}" for i in range(n)} | {"keys", "state_key"}
    if set(data) != expected:
        raise bad(f"missing entries {sorted(expected - set(data))}, unexpected entries {sorted(set(data) - expected)}")
    n_res = meta["n_residuals"]
    for i, (p, shape, dtype) in enumerate(leaves):
        for name, want in ((f"pos_{i}", tuple(shape)), (f"residuals_{i}", (n_res,) + tuple(shape))):
            a = data[name]
            if a.shape != want or str(a.dtype) != dtype:
                raise bad(f"{name} (latent {p or '.'}) has shape {a.shape} {a.dtype}, expected {want} {dtype}")
    key, keys = data["state_key"], data["keys"]
    if key.dtype != np.uint32 or key.shape != (2,):
        raise bad(f"state_key must be a raw threefry key, shape (2,) uint32, got {key.shape} {key.dtype}")
    if keys.dtype != np.uint32 or keys.ndim != 2 or keys.shape[1] != 2:
        raise bad(f"keys must have shape (n_keys, 2) uint32, got {keys.shape} {keys.dtype}")
    k = keys.shape[0]
    if k and n_res not in (k, 2 * k):
        raise bad(f"{k} sample keys for {n_res} residuals (expected one key per residual or per pair)")
    treedef = jtu.tree_structure(like_pos)
    pos = jtu.tree_unflatten(treedef, [jnp.asarray(data[f"pos_{i}"]) for i in range(n)])
    res = jtu.tree_unflatten(treedef, [jnp.asarray(data[f"residuals_{i}"]) for i in range(n)])
    return Samples(pos, res, jnp.asarray(keys) if k else None), jnp.asarray(key)


def load_checkpoint(directory, like_pos, *, fingerprint: dict | None = None, check_history=None, force: bool = False):
    """Read and validate the newest checkpoint in ``directory``.

    Everything is checked before it is returned: the index (every field), the
    arrays' SHA-256, their names, shapes and dtypes against the recorded
    structure, and, if given, the fingerprint of the current run.

    Parameters
    ----------
    directory : str or os.PathLike
        A ``checkpoint_dir`` written by :func:`save_checkpoint`.
    like_pos : pytree
        A latent position of the current model; the checkpoint must have the
        same tree structure, shapes and dtypes.
    fingerprint : dict, optional
        :func:`fingerprint` of the current run, compared with the stored one
        (checked as :func:`save_checkpoint` checks it).
    check_history : callable(tuple of IterationReport) -> list of str, optional
        Further differences between the stored iterations and the current
        run's settings (``optimize_kl`` compares the sample counts and modes).
    force : bool
        Load despite fingerprint / history differences (with a warning).
        A different latent structure is never loaded. A Python or NumPy bool.

    Returns
    -------
    (Samples, OptimizeVIState)

    Raises
    ------
    TypeError
        ``fingerprint`` is neither ``None`` nor a dict of JSON values,
        ``check_history`` is neither ``None`` nor callable, ``force`` is not
        a bool (checked before anything is read).
    ValueError
        ``fingerprint`` does not have the layout of :func:`fingerprint`'s
        result.
    CheckpointError
        Missing/corrupted/invalid files, a checksum mismatch, a different
        structure, or (without ``force``) a different fingerprint.
    """
    d = check_path(directory, "directory")
    fingerprint = check_fingerprint(fingerprint, "fingerprint")
    if check_history is not None and not callable(check_history):
        raise TypeError(
            "check_history must be None or a callable(tuple of IterationReport) -> list of str, "
            f"got {type(check_history).__name__}"
        )
    check_bool(force, "force")
    meta = _read_index(d)
    expected = _structure(like_pos)
    if meta["structure"] != expected:
        raise CheckpointError(
            f"checkpoint in {d!r} was written for a different model structure (latent structure; this cannot "
            f"be forced):\n  checkpoint: {meta['structure']}\n  current:    {expected}"
        )
    history = tuple(IterationReport(**r) for r in meta["history"])
    diffs = []
    if fingerprint is not None:
        if meta.get("fingerprint") is None:
            logger.warning(
                "checkpoint in %s has no fingerprint (written by an older shardvi): its data and "
                "settings are not compared with this run",
                d,
            )
        else:
            diffs += _fingerprint_differences(meta["fingerprint"], fingerprint)
            unknown = (fingerprint.get("likelihood") or {}).get("unknown")
            if unknown:
                logger.info("checkpoint fingerprint: likelihood parts %s are unknown (not compared)", unknown)
    if check_history is not None:
        found = check_history(history)
        if not isinstance(found, (list, tuple)) or not all(isinstance(x, str) for x in found):
            raise TypeError(f"check_history must return a list of str, got {found!r}")
        diffs += list(found)
    if diffs:
        listing = "\n".join(f"  - {x}" for x in diffs)
        if not force:
            raise CheckpointError(
                f"the checkpoint in {d!r} (iteration {meta['nit']}) belongs to a different run:\n{listing}\n"
                f"Resume it anyway with resume='force' (optimize_kl) or force=True (load_checkpoint); start afresh "
                f"with resume=False, overwrite=True (replaces it), or use another checkpoint_dir."
            )
        warnings.warn(
            f"resuming the checkpoint in {d!r} although it belongs to a different run (forced):\n{listing}",
            RuntimeWarning,
            stacklevel=2,
        )
    samples, key = _read_arrays(d, meta, like_pos)
    return samples, OptimizeVIState(nit=meta["nit"], key=key, history=history)
