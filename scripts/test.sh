#!/usr/bin/env bash
# Runs every test: unit tests, the e2e suite (real sluice and mock-upstream processes over
# loopback, a real redis-server, the official openai Python SDK). Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export SLUICE_PYTHON="$PWD/.venv/bin/python"
cargo build --locked --bins
cargo test --locked --lib --bins --tests -- --test-threads "${SLUICE_TEST_THREADS:-4}"
