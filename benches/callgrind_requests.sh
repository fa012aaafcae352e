#!/usr/bin/env bash
# Instructions per request of one Sluice build, under callgrind (load-independent, unlike
# the load bench's wall-clock figures). Used for the structure issue's before/after
# (benches/README.md, "Structure (issue 27): before/after").
#
#   benches/callgrind_requests.sh SLUICE_BIN MOCK_BIN OUT_DIR [N]
#
# Starts the mock (`sluice-mock-upstream`, natively, 100 tokens, no delay: the load bench's
# unary and stream behaviour) and Sluice under `valgrind --tool=callgrind` with the load
# bench's config (one tenant, one key, one openai-kind provider at the mock, one model;
# `RUST_LOG=info`, access log to a file) but `threads: 1`. Then, over one keep-alive
# connection (one `curl` with `--next` per request), sequentially:
#   warm-up: 20 non-stream + 20 stream requests, then `callgrind_control -z` (zero);
#   phase `unary`:  N non-stream requests, then `callgrind_control -d unary` (dump + zero);
#   phase `stream`: N 100-token SSE streams, then `callgrind_control -d stream`;
#   phase `idle`:   10 s without requests, then `callgrind_control -d idle` (the background:
#                   timers, sweeps; subtract it per second if it matters).
# Prints instructions (Ir) per request of each phase. Loopback only; every wait is bounded.
#
# CG_DIALECT=messages measures Anthropic Messages to an anthropic-kind provider instead (the
# other same-dialect path) with the same shape of request.
set -euo pipefail

SLUICE_BIN=${1:?sluice binary}
MOCK_BIN=${2:?sluice-mock-upstream binary}
OUT=${3:?output folder}
N=${4:-500}
WARM=20
KEY=sk-sluice-load-0001
MODEL=acme/chat
DIALECT=${CG_DIALECT:-chat}
case "$DIALECT" in
    chat) KIND=openai; PATH_=/v1/chat/completions ;;
    messages) KIND=anthropic; PATH_=/v1/messages ;;
    *) echo "CG_DIALECT: chat or messages" >&2; exit 2 ;;
esac

mkdir -p "$OUT/conf"
OUT=$(cd "$OUT" && pwd)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 1
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# The mock, natively.
"$MOCK_BIN" --listen 127.0.0.1:0 --behavior '{"tokens":100,"token_delay_ms":0}' \
    >"$OUT/mock.out" 2>"$OUT/mock.log" &
pids+=($!)
for _ in $(seq 1 100); do
    grep -q '^listening on ' "$OUT/mock.out" 2>/dev/null && break
    sleep 0.1
done
MOCK=$(sed -n 's/^listening on //p' "$OUT/mock.out")
[ -n "$MOCK" ] || { echo "mock did not start" >&2; exit 1; }

LISTEN=127.0.0.1:$(free_port)
ADMIN=127.0.0.1:$(free_port)
cat >"$OUT/conf/sluice.yaml" <<EOF
server:
  listen: $LISTEN
  admin_listen: $ADMIN
  threads: 1
tenants:
  t: {}
virtual_keys:
  - key: $KEY
    tenant: t
providers:
  mock:
    kind: $KIND
    base_url: http://$MOCK/v1
    api_key: sk-provider-load
    health_check: {enabled: false}
models:
  $MODEL:
    routes:
      - provider: mock
        upstream_model: mock-small-v1
EOF
"$SLUICE_BIN" -t -c "$OUT/conf/sluice.yaml" >/dev/null

(cd "$OUT" && RUST_LOG=info exec valgrind --tool=callgrind \
    --callgrind-out-file="$OUT/callgrind.out" \
    "$SLUICE_BIN" -c "$OUT/conf/sluice.yaml" >"$OUT/sluice.out" 2>"$OUT/sluice.log") &
VG=$!
pids+=($VG)
up=0
for _ in $(seq 1 600); do   # at most 120 s for start-up under valgrind
    if curl -s -o /dev/null --max-time 2 "http://$LISTEN/" 2>/dev/null; then
        up=1; break
    fi
    sleep 0.2
done
[ $up = 1 ] || { echo "sluice did not come up" >&2; tail "$OUT/sluice.log" >&2; exit 1; }

body() {
    if [ "$DIALECT" = messages ]; then
        printf '{"model":"%s","system":"You are a helpful assistant.","messages":[{"role":"user","content":"Write a short poem about load tests."}],"stream":%s,"max_tokens":256}' "$MODEL" "$1"
    else
        printf '{"model":"%s","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a short poem about load tests."}],"stream":%s,"max_tokens":256}' "$MODEL" "$1"
    fi
}

# One curl, one keep-alive connection, $2 sequential requests (stream=$1).
run() {
    local cfg="$OUT/curl-$1-$2.cfg" i
    body "$1" >"$OUT/body-$1.json"
    : >"$cfg"
    for i in $(seq 1 "$2"); do
        [ "$i" -gt 1 ] && echo 'next' >>"$cfg"
        {
            echo "url = \"http://$LISTEN$PATH_\""
            echo "header = \"authorization: Bearer $KEY\""
            echo "header = \"content-type: application/json\""
            echo "data-binary = \"@$OUT/body-$1.json\""
            echo 'output = "/dev/null"'
            echo 'write-out = "%{http_code} %{num_connects}\n"'
            echo 'max-time = 30'
        } >>"$cfg"
    done
    timeout 900 curl -s -K "$cfg" >"$OUT/codes-$1-$2.txt"
    local ok conns
    ok=$(grep -c '^200 ' "$OUT/codes-$1-$2.txt" || true)
    conns=$(awk '{s+=$2} END {print s+0}' "$OUT/codes-$1-$2.txt")
    echo "stream=$1: $ok of $2 answered 200, $conns connection(s) opened"
    [ "$ok" = "$2" ] || { echo "not every request succeeded" >&2; exit 1; }
}

ctl() { timeout 120 callgrind_control "$@" "$VG" >/dev/null; }

run false "$WARM"
run true "$WARM"
ctl -z
t0=$(date +%s.%N)
run false "$N"
ctl -d unary
t1=$(date +%s.%N)
run true "$N"
ctl -d stream
t2=$(date +%s.%N)
sleep 10
ctl -d idle
t3=$(date +%s.%N)

# Per phase: all of the process's instructions (every thread, start-up excluded by the
# zeroing); the same minus the idle phase's rate x the phase's wall time (time-driven
# background: Pingora's clock thread, the status sampler, the workers' parking); and the
# inclusive cost of the per-connection future, Sluice's `DownstreamApp::process_new`
# (Pingora's `ServerApp`; its module moved in issue 27, so it is matched without it): a
# downstream connection from accept to close (reading, Sluice's filters, the upstream
# exchange, writing, logging); plus the ledger writer thread (`...ledger::writer::run`).
dump() { grep -l "^desc: Trigger: dump $1\$" "$OUT"/callgrind.out.* | head -1; }
incl() {
    (cd / && callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null) \
        | { grep -F "$2" || true; } | head -1 | awk '{gsub(",", "", $1); print $1}'
}
HE='DownstreamApp as pingora_core::apps::ServerApp>::process_new::{{closure}} ['
LW='ledger::writer::run ['
idle_f=$(dump idle)
idle_ir=$(awk '/^summary:/ {print $2}' "$idle_f")
idle_s=$(echo "$t3 - $t2" | bc -l)
rate=$(echo "$idle_ir / $idle_s" | bc -l)
printf 'idle: %d Ir in %.1f s = %.0f Ir/s\n' "$idle_ir" "$idle_s" "$rate"
printf '%-7s %8s %14s %12s %14s %14s %14s %12s\n' phase seconds 'Ir total' 'Ir/req' 'Ir/req-idle' 'conn Ir/req' 'ledger Ir/req' requests
for phase in unary stream; do
    f=$(dump $phase)
    if [ $phase = unary ]; then secs=$(echo "$t1 - $t0" | bc -l); else secs=$(echo "$t2 - $t1" | bc -l); fi
    total=$(awk '/^summary:/ {print $2}' "$f")
    conn=$(incl "$f" "$HE"); conn=${conn:-0}
    led=$(incl "$f" "$LW"); led=${led:-0}
    printf '%-7s %8.1f %14d %12.0f %14.0f %14.0f %14.0f %12d\n' $phase "$secs" "$total" \
        "$(echo "$total / $N" | bc -l)" "$(echo "($total - $rate * $secs) / $N" | bc -l)" \
        "$(echo "$conn / $N" | bc -l)" "$(echo "$led / $N" | bc -l)" "$N"
done
