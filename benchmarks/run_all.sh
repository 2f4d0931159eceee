#!/usr/bin/env bash
# Run the benchmark set recorded in BENCHMARKS.md (about 35 minutes on 2 cores); JSON lands in out/bench/.
#
#     bash benchmarks/run_all.sh [PYTHON]      # PYTHON defaults to .venv/bin/python
set -eu
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${1:-.venv/bin/python}"
OUT=out/bench
mkdir -p "$OUT"
export JAX_PLATFORMS=cpu
"$PY" benchmarks/bench_nifty.py --shape 128,128 --runs 3 \
    --shardvi vmap,vmap+fusion,vmap-all,shard_map-2cpu,shard_map-2cpu+fusion \
    --nifty default,jit-lmap,jit-vmap,jit-lmap+classic --json "$OUT/nifty.json" | tee "$OUT/nifty.md"
"$PY" benchmarks/bench_metric.py --sizes 32,64,128,256,512,1024 --repeats 10 --json "$OUT/metric.json" | tee "$OUT/metric.md"
"$PY" benchmarks/bench_scaling.py --sizes-1d 4096,65536,1048576 --sizes-2d 64,256,1024 --sweep-pairs 1,2,4,8 \
    --json "$OUT/scaling.json" | tee "$OUT/scaling.md"
