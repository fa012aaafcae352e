#!/usr/bin/env bash
# Runs the unit tests of the patched Pingora crates in vendor/: pingora-core's and pingora-proxy's
# own tests, and the test of each patch (vendor/README.md names them). The crates are not members
# of Sluice's workspace; vendor/Cargo.toml makes them a workspace of their own, locked by
# vendor/Cargo.lock. Built with the rustls feature, as Sluice builds them.
#
# Loopback only. The upstream tests that connect to hosts off this machine (1.1.1.1:80/443,
# 192.0.2.1 of TEST-NET-1, 240.0.0.1, [::3]) are skipped by name below. Where `unshare` can make a
# network namespace, the tests run in one that has only a loopback interface, so that a test that
# tries any other address fails instead of sending traffic.
set -euo pipefail
cd "$(dirname "$0")/.."
# Sluice's target directory: the dependencies both build with the same features are reused.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

args=(--manifest-path vendor/Cargo.toml --locked -p pingora-core -p pingora-proxy
    --features pingora-core/rustls,pingora-proxy/rustls --lib)

# Skipped upstream tests (exact names): those that reach off-machine addresses, and one more.
skips=(
    # 1.1.1.1 (Cloudflare's public resolver), plain and TLS
    connectors::tests::test_connect
    connectors::tests::test_connect_tls
    connectors::tests::test_connect_with_offload_timing
    connectors::l4::tests::test_tweak_hook
    connectors::l4::tests::test_custom_connect
    connectors::http::tests::test_connect_h1
    connectors::http::tests::test_connect_h2
    connectors::http::tests::test_connect_h2_fallback_h1_reuse
    connectors::http::tests::test_connect_prefer_h1
    connectors::http::tests::test_custom_client_non_custom_upstream
    connectors::http::v1::tests::test_connect
    connectors::http::v1::tests::test_connect_tls
    connectors::http::v1::tests::test_reuse_rejects_fd_mismatch
    connectors::http::v2::tests::test_connect_h1
    connectors::http::v2::tests::test_connect_h1_plaintext
    connectors::http::v2::tests::test_connect_h2
    connectors::http::v2::tests::test_h2_single_stream
    connectors::http::v2::tests::test_h2_multiple_stream
    connectors::http::v2::tests::test_h2_reuse_rejects_fd_mismatch
    protocols::l4::ext::test::test_set_fast_open
    # 192.0.2.1 (TEST-NET-1: connection timeouts), 240.0.0.1 and [::3] (unroutable)
    connectors::tests::test_conn_timeout
    connectors::tests::test_conn_timeout_with_offload
    connectors::tests::test_do_connect_with_total_timeout
    connectors::tests::test_do_connect_without_total_timeout
    connectors::tests::test_tls_connect_timeout_supersedes_total
    connectors::tests::test_connector_bind_to
    connectors::l4::tests::test_conn_timeout
    connectors::l4::tests::test_conn_error_other
    connectors::l4::tests::test_conn_error_no_route
    # Not network ones: timing-dependent upstream tests that failed now and then here on a
    # loaded 2-core machine (the first gives the kernel's asynchronous SO_TIMESTAMPING setup
    # 100 us; the second needs a 100 ms timeout to fire through 10 ms cancellations).
    protocols::l4::stream::tests::test_rx_timestamp
    protocols::http::v1::body::test_body_task_api::test_task_timeout_persists_across_cancellations
)
test_args=(--exact)
for t in "${skips[@]}"; do
    test_args+=(--skip "$t")
done

# Build first (this may download crates), then run offline.
cargo test "${args[@]}" --no-run
run=(cargo test --offline "${args[@]}" -- "${test_args[@]}")
if command -v ip >/dev/null && unshare --net ip link set lo up 2>/dev/null; then
    unshare --net sh -c 'ip link set lo up && exec "$@"' sh "${run[@]}"
else
    echo "test-vendor: no network namespace here; running with the skips above only" >&2
    "${run[@]}"
fi
