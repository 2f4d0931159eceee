"""The field-parallel layout comparison of tests/test_field_split.py, in a fresh process; not a test module.

    python tests/_field_split_worker.py PROBLEM LAYOUT [LAYOUT ...]      # e.g. masked 1x4 jit2x2

Runs a problem of tests/test_field_split.py (``grid``: data at every pixel,
``masked``: the data of an ``sv.Mask``, ``transposed``: a model that needs the
whole field, ``JitSharding`` only) on one device (``Vmap``) and on each
``SAMPLESxMODEL`` mesh layout of 4 forced CPU devices (``ShardMap``; with a
``jit`` prefix ``JitSharding``) with the shipped
compiler settings (the test session compiles at LLVM level 0, which keeps
results but not the bitwise equality of different programs) and prints one
JSON line: per layout, whether every array and the KL energy equal the
one-device run bitwise, the run's position and residuals came back with their
grid rows split over the model axis (hyperparameters whole), and its
checkpoint holds the whole position.
"""

import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"


def main(problem, layouts):
    import jax

    jax.config.update("jax_num_cpu_devices", 4)
    from shardvi.parallel import depth_first_cpu_schedule

    depth_first_cpu_schedule()  # a model axis over these CPU devices
    jax.config.update("jax_enable_x64", True)
    import tempfile

    import numpy as np
    from test_field_split import field_split_likelihood, one_device, run

    from shardvi.parallel import JitSharding, ShardMap

    ref, ref_kl = one_device(problem)
    out = {"nonzero": bool(any(np.any(np.asarray(r) != 0) for r in ref))}
    split = jax.tree.leaves(field_split_likelihood(problem).latent_split)
    for name in layouts:
        cls = JitSharding if name.startswith("jit") else ShardMap
        samples, model = (int(v) for v in name.removeprefix("jit").split("x"))
        strategy = cls(devices=jax.devices()[: samples * model], model_shards=model)
        with tempfile.TemporaryDirectory() as tmp:
            arrays, kl = run(strategy, problem, checkpoint_dir=tmp)
            saved = np.load(os.path.join(tmp, "state-000001.npz"))
            whole = all(np.array_equal(saved[f"pos_{i}"], np.asarray(a)) for i, a in enumerate(arrays[: len(split)]))
        same = kl == ref_kl and all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(arrays, ref))
        # position leaves, then residual leaves (samples first): each device holds its rows of the split ones
        rows = all(
            a.addressable_shards[0].data.shape == (a.shape[:-2] + (a.shape[-2] // model, a.shape[-1]) if s else a.shape)
            for a, s in zip(arrays, split + split)
        )
        out[name] = {"bitwise": bool(same), "split": bool(rows), "checkpoint_whole": bool(whole)}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
