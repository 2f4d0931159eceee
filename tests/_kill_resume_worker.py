"""One process of a two-process run that checkpoints and loses a process; not a test module.

    python tests/_kill_resume_worker.py PORT PROCESS_ID ROOT PHASE OUT

``PHASE`` ``kill``: the run of tests/_parallel_problem.py (3 iterations, ``ShardMap`` over the 4 devices
of both processes), each process checkpointing to ``ROOT/process-<id>``; process 1 kills itself (SIGKILL)
after iteration 2, once both checkpoints of iteration 2 are written, and process 0 is left waiting in
iteration 3's collectives. ``PHASE`` ``resume``: both processes resume their checkpoints and finish the
run; process 0 saves the final arrays to ``OUT``.
"""

import json
import os
import signal
import sys
import time


def main(port: int, process_id: int, root: str, phase: str, out: str) -> None:
    from _distributed_worker import join
    from _timeouts import scaled

    import shardvi as sv

    join(port, process_id, heartbeat_timeout=5)
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from _parallel_problem import final_arrays, run_reconstruction

    other = os.path.join(root, f"process-{1 - process_id}", "latest.json")

    def other_wrote(nit: int) -> bool:
        try:
            with open(other) as f:
                return json.load(f)["nit"] == nit
        except (OSError, ValueError, KeyError):
            return False

    def die_after_iteration_2(samples, state):
        if phase == "kill" and process_id == 1 and state.nit == 2:
            deadline = time.monotonic() + scaled(60)
            while not other_wrote(2) and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)

    samples, state = run_reconstruction(
        sv.parallel.ShardMap(),
        checkpoint_dir=os.path.join(root, f"process-{process_id}"),
        resume=phase == "resume",
        callback=die_after_iteration_2,
        progress=False,
    )
    if process_id == 0:
        np.savez(out, *final_arrays(samples, state))
    sv.parallel.shutdown_distributed()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
