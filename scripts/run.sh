#!/usr/bin/env bash
# Builds Sluice (release) and runs it on the default config: the built-in demo provider,
# no API key, no network. Installs the build prerequisites (cmake) first if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --run
exec cargo run --locked --release --bin sluice -- -c "${1:-conf/sluice.yaml}"
