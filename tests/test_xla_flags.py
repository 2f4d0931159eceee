"""``import shardvi`` chooses XLA:CPU's depth-first schedule (``shardvi._xla_flags``) unless told not to.

With XLA's default (concurrency-optimized) schedule, ``ShardMap`` 2x2 on a 128² field split stopped in
XLA's rendezvous timeout in 10 of 18 runs (two devices of a model row each waiting in another collective);
with the flag in none of 14 (BENCHMARKS.md). Each case runs in a fresh process: the flag only acts before
JAX's backend starts.
"""

import json
import os
import subprocess
import sys

import pytest

FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"

PROBE = """
import json, os, sys, warnings
if sys.argv[1] == "jax-first":
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    jax.devices()
import shardvi
if sys.argv[1] == "replaced":
    os.environ["XLA_FLAGS"] = "--xla_cpu_use_thunk_runtime=true"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    shardvi.parallel.ShardMap(devices=jax.devices()[:2], model_shards=2).mesh
print(json.dumps({"flags": os.environ.get("XLA_FLAGS"), "state": shardvi._xla_flags.STATE,
                  "warned": [str(w.message)[:60] for w in caught if issubclass(w.category, RuntimeWarning)]}))
"""


def probe(order="shardvi-first", **env):
    base = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SHARDVI_KEEP_XLA_FLAGS")}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, order],
        env={**base, "JAX_PLATFORMS": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "env,order,flags,state,warns",
    [
        ({}, "shardvi-first", FLAG, "set", False),
        (
            {"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=true"},
            "shardvi-first",
            f"--xla_cpu_use_thunk_runtime=true {FLAG}",
            "set",
            False,
        ),
        (
            {"XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=true"},
            "shardvi-first",
            "--xla_cpu_enable_concurrency_optimized_scheduler=true",
            "user",
            False,
        ),
        ({"SHARDVI_KEEP_XLA_FLAGS": "1"}, "shardvi-first", None, "opted_out", True),
        ({}, "jax-first", None, "too_late", True),
        ({}, "replaced", "--xla_cpu_use_thunk_runtime=true", "set", True),  # XLA_FLAGS replaced after the import
    ],
)
def test_the_flag_is_added_unless_the_user_chose_or_jax_started(env, order, flags, state, warns):
    got = probe(order, **env)
    assert got["flags"] == flags and got["state"] == state
    assert bool(got["warned"]) == warns, got["warned"]  # a model axis on 2 CPU devices of one process
