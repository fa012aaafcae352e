#!/usr/bin/env bash
# Installs what building and testing Sluice needs on a fresh Debian machine, idempotently:
#   cmake + a C compiler (Pingora builds zlib-ng), ca-certificates (TLS to real providers),
#   redis-server (distributed rate-limit tests), postgresql (the usage-ledger tests start their
#   own throwaway server with its initdb/postgres binaries), nginx (load-script comparison, optional),
#   chromium (the status-page test loads the admin page in headless Chromium),
#   systemd (only its systemd-analyze: the e2e test runs `systemd-analyze verify` on the units),
#   openssl (the Vertex AI tests generate service-account RSA keys with it),
#   iproute2 (the agent tests bring up loopback in their network namespace),
#   Node.js and npm with the real clients of tests/agents (Claude Code, Codex, the Vercel AI
#   SDK; `npm ci` from its package-lock.json, again whenever the lock changes),
#   and a Python venv at .venv with the official SDKs and LangChain (tests/sdk/requirements.txt,
#   again whenever it changes).
# Usage: bash scripts/install-deps.sh [--run]   (--run: only what building and running needs)
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
if [ "$mode" != "--run" ]; then
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  command -v nginx >/dev/null 2>&1 || need+=(nginx-light)
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
  # The throwaway PostgreSQL runs as `nobody` through setpriv (util-linux) when tests run as root.
  command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
  # The Vertex AI tests generate their service-account RSA keys with the openssl command line.
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  # The agent tests (tests/e2e/agents.rs) run the npm clients in a loopback-only namespace.
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  command -v unshare >/dev/null 2>&1 || need+=(util-linux)
  command -v node >/dev/null 2>&1 || need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian starts a system redis-server (and a PostgreSQL cluster) on install; the tests start
# their own on free ports.

if [ "$mode" != "--run" ]; then
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  # Installed again whenever requirements.txt changes (its hash is kept in the venv).
  req_hash="$(sha256sum tests/sdk/requirements.txt | cut -d' ' -f1)"
  if [ "$(cat .venv/.requirements.sha256 2>/dev/null)" != "$req_hash" ]; then
    .venv/bin/pip install -q --disable-pip-version-check -r tests/sdk/requirements.txt
    echo "$req_hash" >.venv/.requirements.sha256
  fi
  # The npm clients at the lock's exact versions (with each one's platform binary, an
  # optional dependency); installed again whenever the lock changes.
  lock_hash="$(sha256sum tests/agents/package-lock.json | cut -d' ' -f1)"
  if [ "$(cat tests/agents/node_modules/.lock.sha256 2>/dev/null)" != "$lock_hash" ]; then
    (cd tests/agents && npm ci --no-audit --no-fund --loglevel=error)
    echo "$lock_hash" >tests/agents/node_modules/.lock.sha256
  fi
fi
