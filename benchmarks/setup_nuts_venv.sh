#!/usr/bin/env bash
# Create benchmarks/.venv-nuts: a separate venv with numpyro (the NUTS reference of
# benchmarks/bench_calibration.py) and this project.
#
#     bash benchmarks/setup_nuts_venv.sh          # idempotent; prints the venv's python on success
#
# numpyro is not a dependency of shardvi: it lives only in this venv. jax/jaxlib are pinned to the
# versions of the project venv (if there is one) so both samplers run on the same XLA. shardvi is
# installed editable without its dependencies, which are then installed by name (numpy, scipy, optax,
# matplotlib, tqdm): jax-finufft is only needed by sv.NUFFTResponse, which the calibration problems do
# not use (`import shardvi` loads it lazily). Exit status 0 with "skipped: ..." on stderr when the
# install fails (no network, no matching wheel): the calibration benchmark then cannot run, nothing
# else depends on it.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=benchmarks/_venv.sh
. "$HERE/_venv.sh"
bench_venv "${NUTS_VENV:-$HERE/.venv-nuts}" "import numpyro, shardvi, matplotlib, shardvi.models.correlated_field" \
    --no-deps "${NUMPYRO_SPEC:-numpyro>=0.15}" numpy scipy optax matplotlib tqdm
