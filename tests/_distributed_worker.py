"""One process of the two-process test (tests/test_distributed.py); not a test module.

    python tests/_distributed_worker.py PORT PROCESS_ID OUT.npz STRATEGY

Joins a 2-process JAX runtime on 127.0.0.1 with 2 CPU devices per process,
runs a short reconstruction with ``STRATEGY`` over all 4 global devices and
(process 0) saves samples, position and KL energies; with ``shard_map`` also a
model-parallel run (``model_shards=2``, the data blocks split over the processes).
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"


def main(port: int, process_id: int, out: str, strategy: str) -> None:
    import shardvi as sv  # imports jax but runs no JAX computation

    sv.parallel.initialize_distributed(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, local_device_count=2, initialization_timeout=60
    )
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from _parallel_problem import final_arrays, run_reconstruction

    assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
    strat = {"shard_map": sv.parallel.ShardMap, "jit": sv.parallel.JitSharding}[strategy]()  # all 4 devices
    samples, state = run_reconstruction(strat)
    arrays = final_arrays(samples, state)  # replicated outputs: every process can read them
    if process_id == 0:
        np.savez(out, *arrays)
    if strategy == "shard_map":  # model parallelism: the data blocks split over the two processes
        from _model_parallel_problem import masked_local_blocks, masked_problem, run_layout, start_position

        from shardvi.vi.blocked import assemble_process_blocks

        model, _, _ = masked_problem()
        pos = start_position(model)  # the start of the one-device reference (one_device_run)
        d = jax.devices()  # process-major: rows (p0, p1) put the model axis across the processes
        mp = sv.parallel.ShardMap(devices=[d[0], d[2], d[1], d[3]], model_shards=2)
        # each process loads only its 2 of the 4 data blocks (column p of the mesh) and joins the others'
        blocked = assemble_process_blocks(masked_local_blocks(2 * process_id, 2), mp)
        got, kl, _ = run_layout(blocked, pos, mp)
        if process_id == 0:
            np.savez(out.replace(".npz", "_model.npz"), *[np.asarray(a) for a in got], kl=np.asarray(kl))
    sv.parallel.shutdown_distributed()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
