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
ROOT="$(cd "$HERE/.." && pwd)"
VENV="${NUTS_VENV:-$HERE/.venv-nuts}"
PY="$VENV/bin/python"
STAMP="$VENV/.installed"
NUMPYRO_SPEC="${NUMPYRO_SPEC:-numpyro>=0.15}"
CHECK="import numpyro, shardvi, matplotlib, shardvi.models.correlated_field"

if [ -f "$STAMP" ] && "$PY" -c "$CHECK" >/dev/null 2>&1; then
    echo "$PY"
    exit 0
fi
JAX_PIN=""
if [ -x "$ROOT/.venv/bin/python" ]; then
    JAX_VER="$("$ROOT/.venv/bin/python" -c 'import jax; print(jax.__version__)' 2>/dev/null || true)"
    [ -n "$JAX_VER" ] && JAX_PIN="jax==$JAX_VER jaxlib==$JAX_VER"
fi
skip() { echo "skipped: $1" >&2; exit 0; }
python3 -m venv "$VENV" || skip "could not create $VENV"
"$PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
# shellcheck disable=SC2086
"$PY" -m pip install --quiet $JAX_PIN "$NUMPYRO_SPEC" numpy scipy optax matplotlib tqdm \
    || skip "pip install '$NUMPYRO_SPEC' $JAX_PIN numpy scipy optax matplotlib tqdm failed"
"$PY" -m pip install --quiet --no-deps -e "$ROOT" || skip "pip install --no-deps -e $ROOT failed"
"$PY" -c "$CHECK" || skip "numpyro or shardvi does not import in $VENV"
touch "$STAMP"
echo "$PY"
