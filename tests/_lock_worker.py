"""Subprocess body for tests/test_checkpoint.py: hold the writer lock of a checkpoint_dir.

usage: python _lock_worker.py CHECKPOINT_DIR

Prints ``locked <pid>`` once the lock is held; releases it and exits when its
standard input is closed (or it is killed, which leaves a stale lock).
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

from shardvi.vi.checkpoint import checkpoint_lock


def main(directory):
    with checkpoint_lock(directory):
        print("locked", os.getpid(), flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1])
