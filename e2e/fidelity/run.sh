#!/usr/bin/env bash
# Fidelity check: drives the Talos emulator with an independent client generated from the
# official Talos protos (PyPI talos-linux-api-v1-6-0, see requirements.txt), under pytest.
#
#   bash e2e/fidelity/run.sh [pytest args...]
#
# Needs python3 (3.11+) with venv and pip, cargo, and PyPI. The venv lives outside the
# checkout, keyed by the hash of requirements.txt:
#   ${KONTINUUM_CACHE:-$HOME/.cache/kontinuum}/fidelity-venv/<hash>
# KONTINUUM_TESTBED_BIN is taken from the environment, else from e2e/testbed/build-tools.sh.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cargo="${CARGO:-cargo}"
python="${PYTHON:-python3}"

# --- the venv -------------------------------------------------------------------------------
hash="$(sha256sum "$here/requirements.txt" | cut -c1-16)"
venv="${KONTINUUM_CACHE:-$HOME/.cache/kontinuum}/fidelity-venv/$hash"
if [[ ! -f "$venv/.complete" ]]; then
    echo "fidelity: creating the venv $venv" >&2
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-input -r "$here/requirements.txt"
    touch "$venv/.complete"
fi

# --- the binaries ---------------------------------------------------------------------------
target="${CARGO_TARGET_DIR:-$root/target}"
(cd "$root" && "$cargo" build --locked --quiet -p talos-emulator -p kontinuum-fidelity-gen)

if [[ -z "${KONTINUUM_TESTBED_BIN:-}" ]]; then
    KONTINUUM_TESTBED_BIN="$(bash "$root/e2e/testbed/build-tools.sh")"
fi
export KONTINUUM_TESTBED_BIN
export FIDELITY_EMULATOR_BIN="$target/debug/talos-emulator"
export FIDELITY_GEN_BIN="$target/debug/fidelity-gen"

# --- the test -------------------------------------------------------------------------------
cd "$here"
exec "$venv/bin/python" -m pytest "$@"
