#!/usr/bin/env bash
# Installs Sluice as a systemd service, idempotently:
#   target/release/sluice          -> /usr/bin/sluice          (built first if missing, but
#                                                               not as root under sudo;
#                                                               $CARGO_TARGET_DIR/release/sluice
#                                                               when that is set, as cargo does)
#   conf/sluice.yaml               -> /etc/sluice/sluice.yaml  (only if absent: yours is kept)
#   systemd/sluice.env.example     -> /etc/sluice/sluice.env   (only if absent; mode 600)
#   systemd/sluice.service         -> /etc/systemd/system/sluice.service
#   README.md                      -> /usr/share/doc/sluice/README.md (the unit's Documentation=)
#   systemd/graceful-upgrade.conf  -> /usr/share/doc/sluice/graceful-upgrade.conf (an optional
#                                     drop-in: `systemctl reload` = graceful upgrade; not enabled)
#   a `sluice` system user and group (no home, no login shell)
# then `systemctl daemon-reload`. It does not enable or start the service: edit
# /etc/sluice/sluice.yaml and /etc/sluice/sluice.env, check with `sluice -t -c
# /etc/sluice/sluice.yaml`, then `systemctl enable --now sluice`.
#
# Usage: sudo bash scripts/install.sh
# Environment:
#   SLUICE_BIN=path   install this binary instead of target/release/sluice (no build)
#   CARGO_TARGET_DIR  where cargo builds (default target/): the binary is taken from there
#   DESTDIR=dir       stage everything under dir (packaging, tests): no user is created and
#                     systemctl is not called
set -euo pipefail
cd "$(dirname "$0")/.."

dest="${DESTDIR:-}"
bin="${SLUICE_BIN:-${CARGO_TARGET_DIR:-target}/release/sluice}"
if [ -z "${SLUICE_BIN:-}" ] && [ ! -x "$bin" ]; then
  # Under sudo, do not build as root: cargo is usually not on root's PATH, and a root build
  # leaves root-owned files in the user's target/ and ~/.cargo. Build as the user first.
  if [ "$(id -u)" -eq 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    echo "install.sh: there is no $bin, and this script does not build it as root." >&2
    echo "  Build it as $SUDO_USER first, then install:" >&2
    echo "    cargo build --locked --release --bin sluice   (or: bash scripts/run.sh)" >&2
    echo "    sudo bash scripts/install.sh" >&2
    echo "  or name a binary: sudo SLUICE_BIN=/path/to/sluice bash scripts/install.sh" >&2
    exit 1
  fi
  bash scripts/install-deps.sh --run
  cargo build --locked --release --bin sluice
fi
[ -x "$bin" ] || { echo "install.sh: no executable at $bin" >&2; exit 1; }
if [ -z "$dest" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (sudo bash scripts/install.sh), or set DESTDIR to stage" >&2
  exit 1
fi

install -d -m 755 "$dest/usr/bin" "$dest/etc/systemd/system" "$dest/usr/share/doc/sluice"
install -d -m 750 "$dest/etc/sluice"
install -m 755 "$bin" "$dest/usr/bin/sluice"
install -m 644 systemd/sluice.service "$dest/etc/systemd/system/sluice.service"
install -m 644 README.md "$dest/usr/share/doc/sluice/README.md"
install -m 644 systemd/graceful-upgrade.conf "$dest/usr/share/doc/sluice/graceful-upgrade.conf"
[ -e "$dest/etc/sluice/sluice.yaml" ] || install -m 640 conf/sluice.yaml "$dest/etc/sluice/sluice.yaml"
[ -e "$dest/etc/sluice/sluice.env" ] || install -m 600 systemd/sluice.env.example "$dest/etc/sluice/sluice.env"

if [ -z "$dest" ]; then
  if ! getent passwd sluice >/dev/null; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
      --user-group sluice
  fi
  chgrp sluice /etc/sluice /etc/sluice/sluice.yaml
  if command -v systemctl >/dev/null 2>&1; then
    systemctl daemon-reload || true
  fi
fi
echo "installed: $dest/usr/bin/sluice, $dest/etc/sluice/, $dest/etc/systemd/system/sluice.service,"
echo "           $dest/usr/share/doc/sluice/"
echo "next: edit $dest/etc/sluice/sluice.yaml and $dest/etc/sluice/sluice.env, then"
echo "      sluice -t -c /etc/sluice/sluice.yaml && systemctl enable --now sluice"
