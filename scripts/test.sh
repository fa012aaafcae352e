#!/usr/bin/env bash
# Runs every test: unit tests, the e2e suite (real sluice and mock-upstream processes over
# loopback, a real redis-server, the official openai Python SDK), the fuzz targets
# (tests/fuzz.rs) and the benches' sanity runs. Installs what is missing first.
#
# SLUICE_FUZZ_SECS=N (CI: 60) then runs each fuzz target for about N seconds more; unset or
# 0, the fuzz targets run one quick round (PROPTEST_CASES, default 256) with the other tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export SLUICE_PYTHON="$PWD/.venv/bin/python"
cargo build --locked --bins
# The API docs build without a warning (a broken intra-doc link fails here).
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --workspace --document-private-items
# Unit, e2e and fuzz (quick round) tests. The fuzz budget below is not applied here.
SLUICE_FUZZ_SECS=0 cargo test --locked --workspace --lib --bins --tests -- --test-threads "${SLUICE_TEST_THREADS:-4}"
bash scripts/test-vendor.sh # The patched Pingora crates' own tests and each patch's test (vendor/README.md).
# Each bench once in test mode (criterion runs every case once; the process benches run a
# short sanity pass), so a bench that no longer works fails CI.
cargo test --locked --bench '*'
fuzz_secs="${SLUICE_FUZZ_SECS:-0}"
if [ "$fuzz_secs" != 0 ]; then
    # One thread per target: 4 targets on 2 cores, about fuzz_secs of wall time in all.
    SLUICE_FUZZ_SECS="$fuzz_secs" cargo test --locked --test fuzz -- --test-threads 4
fi
