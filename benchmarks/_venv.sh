# Shared by benchmarks/setup_*_venv.sh (sourced, not run): a separate, idempotent benchmark venv.
#
#     bench_venv VENV CHECK "SHARDVI_PIP_FLAGS" PACKAGE...
#
# Creates VENV (unless its stamp exists and `python -c CHECK` passes), installs PACKAGE... with
# jax/jaxlib pinned to the versions of the project venv (if there is one, so that both engines run on
# the same XLA), then this project editable with SHARDVI_PIP_FLAGS (e.g. --no-deps), checks CHECK and
# prints the venv's python. Any failure (no network, no matching wheel) prints "skipped: ..." on
# stderr and exits the calling script with status 0: the benchmark that needs the venv is then skipped.

skip() { echo "skipped: $1" >&2; exit 0; }

bench_venv() {
    local venv="$1" check="$2" root_flags="$3"
    shift 3
    local py="$venv/bin/python" stamp="$venv/.installed" root pin="" ver
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    if [ -f "$stamp" ] && "$py" -c "$check" >/dev/null 2>&1; then
        echo "$py"
        return 0
    fi
    if [ -x "$root/.venv/bin/python" ]; then
        ver="$("$root/.venv/bin/python" -c 'import jax; print(jax.__version__)' 2>/dev/null || true)"
        [ -n "$ver" ] && pin="jax==$ver jaxlib==$ver"
    fi
    python3 -m venv "$venv" || skip "could not create $venv"
    "$py" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    "$py" -m pip install --quiet $pin "$@" || skip "pip install $* $pin failed"
    # shellcheck disable=SC2086
    "$py" -m pip install --quiet $root_flags -e "$root" || skip "pip install $root_flags -e $root failed"
    "$py" -c "$check" || skip "'$check' fails in $venv"
    touch "$stamp"
    echo "$py"
}
