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
# shellcheck source=benchmarks/_venv.sh
. "$HERE/_venv.sh"
bench_venv "${NIFTY_VENV:-$HERE/.venv-nifty}" "import nifty.re, shardvi" "" "${NIFTY_SPEC:-nifty>=9,<10}"
