#!/usr/bin/env bash
# Pingora's own instructions per request, against nginx's, under callgrind: the figure the
# changes in this folder are measured by (README.md, "The changes"; ../benches/README.md,
# "Pingora's share (issue 31)").
#
#   vendor/callgrind-smallest.sh smallest|nginx SMALLEST_BIN MOCK_BIN OUT_DIR [N]
#
# Starts the mock (`sluice-mock-upstream`, natively, 100 tokens, no delay) and, under
# `valgrind --tool=callgrind`, either `pingora-smallest` (benches/pingora-smallest: a
# `ProxyHttp` with only `upstream_peer`, one worker thread) or nginx (`daemon off;
# master_process off; worker_processes 1;`, HTTP/1.1 upstream with `keepalive`,
# `proxy_set_header Connection ""`, `proxy_buffering off`, no access log). Then, over one
# keep-alive connection (one `curl` with `--next` per request), sequentially:
#   warm-up: 20 non-stream + 20 stream requests, then `callgrind_control -z`;
#   phase `unary`:  N non-stream Chat requests, then `callgrind_control -d unary`;
#   phase `stream`: N 100-event SSE streams, then `callgrind_control -d stream`.
# Prints the process's instructions (Ir, every thread) per request of each phase.
# Loopback only; every wait is bounded.
set -euo pipefail

TARGET=${1:?smallest or nginx}
SMALLEST_BIN=${2:?pingora-smallest binary}
MOCK_BIN=${3:?sluice-mock-upstream binary}
OUT=${4:?output folder}
N=${5:-200}
WARM=20

mkdir -p "$OUT"
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
case "$TARGET" in
    smallest)
        (cd "$OUT" && exec valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out" \
            "$SMALLEST_BIN" "$LISTEN" "$MOCK" 1 >"$OUT/target.out" 2>"$OUT/target.log") &
        ;;
    nginx)
        mkdir -p "$OUT/nginx"
        user=""
        [ "$(id -u)" = 0 ] && user="user root;"
        cat >"$OUT/nginx/nginx.conf" <<CONF
$user
daemon off;
master_process off;
worker_processes 1;
pid $OUT/nginx/nginx.pid;
error_log $OUT/nginx/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $OUT/nginx/client_body;
    proxy_temp_path $OUT/nginx/proxy;
    fastcgi_temp_path $OUT/nginx/fastcgi;
    uwsgi_temp_path $OUT/nginx/uwsgi;
    scgi_temp_path $OUT/nginx/scgi;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    upstream mock {
        server $MOCK;
        keepalive 64;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }
    server {
        listen $LISTEN;
        location / {
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 60s;
        }
    }
}
CONF
        (cd "$OUT" && exec valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out" \
            "$(command -v nginx || echo /usr/sbin/nginx)" -p "$OUT/nginx" -c "$OUT/nginx/nginx.conf" \
            >"$OUT/target.out" 2>"$OUT/target.log") &
        ;;
    *) echo "target: smallest or nginx" >&2; exit 2 ;;
esac
VG=$!
pids+=($VG)
up=0
for _ in $(seq 1 600); do   # at most 120 s for start-up under valgrind
    if curl -s -o /dev/null --max-time 2 "http://$LISTEN/" 2>/dev/null; then
        up=1; break
    fi
    sleep 0.2
done
[ $up = 1 ] || { echo "$TARGET did not come up" >&2; tail "$OUT/target.log" >&2; exit 1; }

body() {
    printf '{"model":"mock-small-v1","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a short poem about load tests."}],"stream":%s,"max_tokens":256}' "$1"
}

# One curl, one keep-alive connection, $2 sequential requests (stream=$1).
run() {
    local cfg="$OUT/curl-$1-$2.cfg" i
    body "$1" >"$OUT/body-$1.json"
    : >"$cfg"
    for i in $(seq 1 "$2"); do
        [ "$i" -gt 1 ] && echo 'next' >>"$cfg"
        {
            echo "url = \"http://$LISTEN/v1/chat/completions\""
            echo "header = \"authorization: Bearer sk-provider-load\""
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
run false "$N"
ctl -d unary
run true "$N"
ctl -d stream

dump() { grep -l "^desc: Trigger: dump $1\$" "$OUT"/callgrind.out* | head -1; }
printf '%-7s %14s %12s %9s\n' phase 'Ir total' 'Ir/req' requests
for phase in unary stream; do
    f=$(dump $phase)
    total=$(awk '/^summary:/ {print $2}' "$f")
    printf '%-7s %14d %12.0f %9d\n' $phase "$total" "$(echo "$total / $N" | bc -l)" "$N"
    echo "$f" >"$OUT/$phase.file"
done
