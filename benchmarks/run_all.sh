#!/usr/bin/env bash
# Run the CPU benchmarks of BENCHMARKS.md that need no process settings of their own (tens of minutes on
# 2 cores); JSON lands in out/bench/. The field-split, accuracy and GPU benchmarks have their commands there.
#
#     bash benchmarks/run_all.sh [PYTHON]      # PYTHON defaults to .venv/bin/python
set -eu
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${1:-.venv/bin/python}"
OUT=out/bench
mkdir -p "$OUT"
export JAX_PLATFORMS=cpu
"$PY" benchmarks/bench_nifty.py --shape 96,160 --samples 3 --linear-iterations 1 --runs 2 \
    --shardvi vmap,shard_map-2cpu --nifty jit-lmap --json "$OUT/nifty_96x160.json" | tee "$OUT/nifty_96x160.md"
"$PY" benchmarks/bench_nifty.py --shape 128,128 --runs 2 \
    --shardvi vmap,shard_map-2cpu,vmap+cache,shard_map-2cpu+cache --nifty jit-lmap \
    --json "$OUT/nifty_128.json" | tee "$OUT/nifty_128.md"
"$PY" benchmarks/bench_strategies.py --npix 1024 --samples 4 --iterations 3 --json "$OUT/strategies.json" \
    | tee "$OUT/strategies.md"
"$PY" benchmarks/bench_metric.py --sizes 32,64,128,256,512,1024 --repeats 10 --json "$OUT/metric.json" | tee "$OUT/metric.md"
"$PY" benchmarks/bench_scaling.py --sizes-1d 4096,65536,1048576 --sizes-2d 64,256,1024 --sweep-pairs 1,2,4,8 \
    --json "$OUT/scaling.json" | tee "$OUT/scaling.md"
"$PY" benchmarks/bench_compile.py --shape 128,128 --json "$OUT/compile.json" | tee "$OUT/compile.md"
