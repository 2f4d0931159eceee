"""``import shardvi`` leaves the process alone; XLA:CPU's depth-first schedule is an explicit opt-in.

With XLA's default (concurrency-optimized) schedule, collectives of several CPU devices of one process on a
model axis can deadlock (``shardvi._xla_flags``); a program opts in with
``shardvi.parallel.depth_first_cpu_schedule()`` before its first JAX computation, and a strategy warns once
where it did not. Each case runs in a fresh process: the flag only acts before JAX's backend starts.
"""

import json
import os
import subprocess
import sys

import pytest
from _timeouts import scaled

FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"

PROBE = """
import json, os, sys, warnings
before = dict(os.environ)
import shardvi
import shardvi.vi, shardvi.parallel, shardvi.models  # the whole library, JAX included
unchanged = dict(os.environ) == before
if sys.argv[1] == "opt-in":
    shardvi.parallel.depth_first_cpu_schedule()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    for _ in range(2):
        shardvi.parallel.ShardMap(devices=jax.devices()[:2], model_shards=2).mesh
print(json.dumps({"flags": os.environ.get("XLA_FLAGS"), "unchanged": unchanged,
                  "warned": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]}))
"""


def probe(mode, **env):
    base = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={**base, "JAX_PLATFORMS": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "env,mode,flags,warns",
    [
        ({}, "plain", None, True),
        ({}, "opt-in", FLAG, False),
        (
            {"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=true"},
            "opt-in",
            f"--xla_cpu_use_thunk_runtime=true {FLAG}",
            False,
        ),
        ({"XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=true"}, "opt-in", None, False),
        ({"XLA_FLAGS": FLAG}, "plain", FLAG, False),
    ],
)
def test_import_changes_no_environment_and_the_schedule_is_opt_in(env, mode, flags, warns):
    got = probe(mode, **env)
    assert got["unchanged"]  # import shardvi (and its subpackages, JAX) left os.environ as it was
    assert got["flags"] == (flags if flags is not None else env.get("XLA_FLAGS"))
    # a model axis on 2 CPU devices of one process without the option: one warning (not one per strategy),
    # naming the call and the flag
    assert len(got["warned"]) == (1 if warns else 0), got["warned"]
    if warns:
        assert "depth_first_cpu_schedule()" in got["warned"][0] and FLAG in got["warned"][0]
