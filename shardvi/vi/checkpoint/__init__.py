"""Array-only checkpoints: ``.npz`` arrays plus a JSON index, written atomically, one writer at a time.

Layout of ``checkpoint_dir``::

    state-000003.npz   arrays of iteration 3 (pos, residuals, keys, RNG state)
    latest.json        metadata, fingerprint, the run's own npz files, SHA-256 of the newest
    .shardvi.lock      while a run writes: JSON with its pid, host and start time

Every file is written to a temporary name (``.tmp-<pid>-<host>-...``),
flushed, fsynced, given the umask's permissions and renamed, so a crash at
any moment leaves either the previous or the new checkpoint, never a partial
one. Only files this run wrote (listed in the index) are ever pruned; other
files in the directory are never touched. Loading uses ``allow_pickle=False``
(no code is ever executed) and validates the whole index and every array
before anything is computed: each failure is a :class:`CheckpointError`.
"""

from .files import FORMAT, LOCK_NAME, CheckpointError, check_path, prepare_checkpoint_dir
from .fingerprints import fingerprint
from .index import read_index
from .lock import checkpoint_lock
from .store import has_checkpoint, load_checkpoint, save_checkpoint

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "has_checkpoint",
    "read_index",
    "checkpoint_lock",
    "prepare_checkpoint_dir",
    "check_path",
    "fingerprint",
    "CheckpointError",
    "FORMAT",
    "LOCK_NAME",
]
