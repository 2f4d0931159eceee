#!/usr/bin/env bash
# Create benchmarks/.venv-nifty: a separate venv with NIFTy.re (nifty 9.x from PyPI) and this project.
#
#     bash benchmarks/setup_nifty_venv.sh          # idempotent; prints the venv's python on success
#
# jax/jaxlib are pinned to the versions of the project venv (if there is one) so both engines run
# on the same XLA. Exit status 0 with "skipped: ..." on stderr when the install fails (no network,
# no matching wheel): the NIFTy.re comparison is then skipped, nothing else depends on it.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
VENV="${NIFTY_VENV:-$HERE/.venv-nifty}"
PY="$VENV/bin/python"
STAMP="$VENV/.installed"
NIFTY_SPEC="${NIFTY_SPEC:-nifty>=9,<10}"

if [ -f "$STAMP" ] && "$PY" -c "import nifty.re, shardvi" >/dev/null 2>&1; then
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
"$PY" -m pip install --quiet $JAX_PIN "$NIFTY_SPEC" || skip "pip install '$NIFTY_SPEC' $JAX_PIN failed"
"$PY" -m pip install --quiet -e "$ROOT" || skip "pip install -e $ROOT failed"
"$PY" -c "import nifty.re, shardvi" || skip "nifty.re or shardvi does not import in $VENV"
touch "$STAMP"
echo "$PY"
