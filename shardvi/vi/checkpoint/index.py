"""The index ``latest.json``: reading it and validating every field."""

from __future__ import annotations

import json
import os
import re

from ..diagnostics import IterationReport
from ..modes import SampleMode
from .files import _INDEX, _LEGACY_FORMATS, _NPZ_RE, FORMAT, CheckpointError, check_path

__all__ = ["check_fingerprint", "read_index"]

_SHA_RE = re.compile(r"[0-9a-f]{64}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int_list(v) -> bool:
    return isinstance(v, list) and all(_is_int(i) for i in v)


_REPORT_CHECKS = {
    "iteration": (_is_int, "an int"),
    "sample_mode": (lambda v: v in {m.value for m in SampleMode}, "one of the sample modes"),
    "n_samples": (lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    "kl_energy": (_is_num, "a number"),
    "sampling_nit": (_is_int_list, "a list of ints"),
    "nonlinear_nit": (_is_int_list, "a list of ints"),
    "kl_nit": (_is_int, "an int"),
    "kl_cg_nit": (_is_int, "an int"),
    "kl_status": (_is_int, "an int"),
    "chi2_likelihood": (lambda v: v is None or _is_num(v), "a number or null"),
    "chi2_prior": (_is_num, "a number"),
    "wall_time": (_is_num, "a number"),
    "sampling_status": (lambda v: v is None or _is_int_list(v), "a list of ints or null"),
    "nonlinear_status": (lambda v: v is None or _is_int_list(v), "a list of ints or null"),
}


def _is_record(r) -> bool:
    return (
        isinstance(r, list)
        and len(r) == 4
        and isinstance(r[0], str)
        and isinstance(r[1], list)
        and all(_is_int(n) and n >= 0 for n in r[1])
        and isinstance(r[2], str)
        and (r[3] is None or (isinstance(r[3], str) and _SHA_RE.fullmatch(r[3]) is not None))
    )


_FINGERPRINT_FORM = "null or {'likelihood': {'leaves': [...], 'unknown': [...]}, 'latent': {...}, 'settings': {...}}"


def _valid_fingerprint(fp) -> bool:
    if fp is None:
        return True
    if not isinstance(fp, dict):
        return False
    lh = fp.get("likelihood")
    if lh is not None and not (
        isinstance(lh, dict)
        and isinstance(lh.get("leaves"), list)
        and all(_is_record(r) for r in lh["leaves"])
        and isinstance(lh.get("unknown"), list)
        and all(isinstance(u, str) for u in lh["unknown"])
    ):
        return False
    if "settings" in fp and not isinstance(fp["settings"], dict):
        return False
    return "latent" not in fp or _valid_structure(fp["latent"])


def _valid_structure(s) -> bool:
    return (
        isinstance(s, dict)
        and isinstance(s.get("treedef"), str)
        and isinstance(s.get("leaves"), list)
        and all(
            isinstance(r, list)
            and len(r) == 3
            and isinstance(r[0], str)
            and isinstance(r[1], list)
            and all(_is_int(n) and n >= 0 for n in r[1])
            and isinstance(r[2], str)
            for r in s["leaves"]
        )
    )


def _validate_index(meta, index: str) -> dict:
    """Check every field of a parsed index; returns it with v1 defaults filled in."""

    def bad(msg):
        return CheckpointError(f"checkpoint index {index!r} is invalid: {msg}")

    if not isinstance(meta, dict):
        raise bad(f"expected a JSON object, got {type(meta).__name__}")
    fmt = meta.get("format")
    if fmt != FORMAT and fmt not in _LEGACY_FORMATS:
        raise bad(f"format is {fmt!r}, expected {FORMAT!r} (is this a shardvi checkpoint?)")
    legacy = fmt in _LEGACY_FORMATS
    required = ["nit", "npz", "sha256", "structure", "n_residuals", "history"] + ([] if legacy else ["files"])
    missing = [k for k in required if k not in meta]
    if missing:
        raise bad(f"missing field(s) {missing}")
    nit = meta["nit"]
    if not _is_int(nit) or nit < 0:
        raise bad(f"nit must be an int >= 0, got {nit!r}")
    npz = meta["npz"]
    if not isinstance(npz, str) or _NPZ_RE.fullmatch(npz) is None:
        raise bad(f"npz must be a bare file name state-NNNNNN.npz inside the checkpoint directory, got {npz!r}")
    if npz != f"state-{nit:06d}.npz":
        raise bad(f"npz {npz!r} does not belong to iteration nit={nit}")
    if not isinstance(meta["sha256"], str) or _SHA_RE.fullmatch(meta["sha256"]) is None:
        raise bad(f"sha256 must be 64 lowercase hex digits, got {meta['sha256']!r}")
    if not _valid_structure(meta["structure"]):
        raise bad("structure must be {'treedef': str, 'leaves': [[path, shape, dtype], ...]}")
    if not _is_int(meta["n_residuals"]) or meta["n_residuals"] < 0:
        raise bad(f"n_residuals must be an int >= 0, got {meta['n_residuals']!r}")
    _validate_history(meta["history"], nit, bad)
    if legacy:
        meta = {**meta, "files": [npz], "fingerprint": None}
    files = meta["files"]
    if not (isinstance(files, list) and all(isinstance(f, str) and _NPZ_RE.fullmatch(f) for f in files)):
        raise bad(f"files must be a list of bare file names state-NNNNNN.npz, got {files!r}")
    if len(set(files)) != len(files) or npz not in files:
        raise bad(f"files {files!r} must be distinct and include npz {npz!r}")
    if not _valid_fingerprint(meta.get("fingerprint")):
        raise bad(f"fingerprint must be {_FINGERPRINT_FORM}")
    return meta


def check_fingerprint(fp, argname: str = "fingerprint"):
    """``fp`` as it reads back from an index: ``None`` or a dict from :func:`~shardvi.vi.checkpoint.fingerprint`.

    The rule an index's fingerprint is read with, applied to an argument:
    JSON-serializable, with the layout of a fingerprint. Returns the JSON
    round trip of ``fp`` (tuples become lists), the form it is compared in.

    Raises
    ------
    TypeError
        ``fp`` is neither ``None`` nor a dict, or holds a value JSON cannot
        store (an array, an object).
    ValueError
        A dict without a fingerprint's layout, or one that refers to itself.
    """
    if fp is None:
        return None
    if not isinstance(fp, dict):
        raise TypeError(
            f"{argname} must be None or a dict from shardvi.vi.checkpoint.fingerprint, got {type(fp).__name__}"
        )
    try:
        text = json.dumps(fp)
    except (TypeError, ValueError, RecursionError) as err:
        kind = TypeError if isinstance(err, TypeError) else ValueError
        raise kind(
            f"{argname} must hold JSON values only (None, bool, int, float, str, lists and dicts of them, "
            f"no cycles): {err}"
        ) from None
    fp = json.loads(text)
    if not _valid_fingerprint(fp):
        raise ValueError(f"{argname} must be {_FINGERPRINT_FORM} (from shardvi.vi.checkpoint.fingerprint)")
    return fp


def _validate_history(history, nit: int, bad) -> None:
    if not isinstance(history, list):
        raise bad(f"history must be a list, got {type(history).__name__}")
    fields = IterationReport._fields
    required = [f for f in fields if f not in IterationReport._field_defaults]
    last = 0
    for j, r in enumerate(history):
        if not isinstance(r, dict):
            raise bad(f"history[{j}] must be an object, got {type(r).__name__}")
        missing = [f for f in required if f not in r]
        unknown = sorted(set(r) - set(fields))
        if missing or unknown:
            raise bad(f"history[{j}] has missing field(s) {missing} / unknown field(s) {unknown}")
        for f, v in r.items():
            check = _REPORT_CHECKS.get(f)
            if check is not None and not check[0](v):
                raise bad(f"history[{j}].{f} must be {check[1]}, got {v!r}")
        if not last < r["iteration"] <= nit:
            raise bad(f"history[{j}].iteration {r['iteration']} is out of order (after {last}, at most nit={nit})")
        last = r["iteration"]


def _read_index(directory: str) -> dict:
    index = os.path.join(directory, _INDEX)
    try:
        with open(index, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint in {directory!r} (missing {_INDEX})") from None
    except IsADirectoryError:
        raise CheckpointError(f"checkpoint index {index!r} is a directory, not a file") from None
    except OSError as err:
        raise CheckpointError(f"checkpoint index {index!r} is unreadable: {err.strerror or err}") from None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CheckpointError(f"checkpoint index {index!r} is corrupted: {err}") from None
    return _validate_index(meta, index)


def _owned_files(directory: str) -> list:
    """The npz files the current index says its run wrote ([] without a valid index)."""
    try:
        return list(_read_index(directory)["files"])
    except CheckpointError:
        return []


def read_index(directory) -> dict:
    """The validated index of ``directory`` (a dict; layout in :mod:`shardvi.vi.checkpoint`)."""
    return _read_index(check_path(directory, "directory"))
