#!/usr/bin/env bash
# Per-request cost of every target of the load bench (issue 31), under callgrind: instructions
# (Ir), allocations and system calls per request and per streamed event, free of the machine's
# load (unlike the load bench's wall-clock figures).
#
#   benches/callgrind_targets.sh OUT_DIR [N]
#
# Targets (CG_TARGETS, comma-separated; default all five, in this order):
#   direct       the mock itself (`sluice-mock-upstream`), the client talking to it;
#   nginx        nginx in front of the mock: the load bench's proxy settings
#                (`proxy_http_version 1.1`, `proxy_set_header Connection ""`,
#                `proxy_buffering off`, upstream `keepalive`, access log to a file) in one
#                process (`daemon off; master_process off; worker_processes 1;`);
#   pingora      Pingora's smallest `ProxyHttp` (`pingora-smallest LISTEN MOCK 1`);
#   sluice-pass  Sluice's passthrough route (`{name: bench, path_prefix: /p/, upstreams:
#                [MOCK]}`, requests to `/p/v1/chat/completions`);
#   sluice       Sluice's LLM route (the config of `benches/callgrind_requests.sh`: one tenant,
#                one key, one openai-kind provider at the mock, one model, `threads: 1`,
#                `RUST_LOG=info` with the access log to a file).
# Scenarios (CG_SCENARIOS; default all four), the first three the load bench's mock behaviour:
#   unary   non-stream, `{"tokens":100,"token_delay_ms":0}`;
#   stream  the same with `"stream":true`: 103 events (100 content events, the finish, usage
#           and `[DONE]`), one write (one HTTP chunk) each, as fast as the native mock writes
#           them; a proxy slowed down by callgrind reads several per read, by an amount that
#           depends on timing (its Ir and syscalls per stream vary by a few % run to run);
#   burst   `{"tokens":100,"token_delay_ms":0,"split":"burst"}`: all events in one write;
#   paced   token by token with `"token_delay_ms":CG_PACED_DELAY_MS` (default 5): the proxy
#           reads, handles and writes each content event alone (the per-event cost; with
#           1 ms the mock's timer sometimes fires two writes back to back and the proxy
#           reads both at once: ±5 % run to run). N/10 streams (at least 2), and CG_WARM/10
#           in the warm-up.
#
# Only the measured target runs under `valgrind --tool=callgrind --collect-systime=yes`: the
# mock runs natively except for `direct`, the client (`curl`) always natively. Per target:
# start, warm-up (CG_WARM requests of each scenario, default 20), then per scenario: set the
# mock's behaviour (`POST /_mock/behavior`, straight to the mock), `callgrind_control -z`
# (zero), N sequential requests over one keep-alive connection (one `curl -K` with `next`
# between requests; every answer must be a 200, and a stream must end with `data: [DONE]`),
# `callgrind_control -d SCENARIO` (dump); then `idle`: zero, CG_IDLE_S seconds (default 5)
# without requests, dump: the target's time-driven background (timer threads, sweeps).
#
# Figures per request, from each dump:
#   Ir        the `summary:` total of the `Ir` event: every thread, start-up and warm-up
#             excluded by the zeroing;
#   syscalls  the `summary:` total of callgrind's `sysCount` event (`--collect-systime=yes`:
#             one per system call the process made);
#   allocs    calls into malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign,
#             valloc and pvalloc from any function outside that set (a call the allocator
#             makes to itself is not a second allocation), summed from the `calls=` lines of
#             the dump (the call counts callgrind records exactly; `--skip-plt=yes` credits a
#             call through the PLT to its real target);
# each minus the idle phase's rate per second x the phase's wall-clock seconds (the
# background that ran while the requests did; the raw totals are in the TSV too), divided
# by N. `Ir/event` = a stream's Ir / the `data:` events of one stream (counted in the last
# answer of the phase, `[DONE]` included). Run to run, Ir per request of unary, burst and
# paced moves by about 1 % (the background subtraction, the connection's timing).
#
# Writes OUT_DIR/instructions.tsv (one line per target and scenario; the load bench reads it
# with `LOAD_INSTRUCTIONS=OUT_DIR/instructions.tsv`) and prints the table. Each target's
# files (configs, logs, the callgrind dumps) are in OUT_DIR/TARGET/.
#
# Binaries (absolute paths or relative to the current folder), defaults from this checkout:
#   SLUICE_BIN=target/release/sluice MOCK_BIN=target/release/sluice-mock-upstream
#   PINGORA_BIN=target/release/pingora-smallest NGINX_BIN=$(command -v nginx)
# (`cargo build --release --bins -p sluice -p pingora-smallest`). A target whose binary is
# missing is skipped with a note. Loopback only; every wait is bounded; every process this
# script starts is stopped when it ends.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:?usage: callgrind_targets.sh OUT_DIR [N]}
N=${2:-200}
WARM=${CG_WARM:-20}
IDLE_S=${CG_IDLE_S:-5}
PACED_DELAY_MS=${CG_PACED_DELAY_MS:-5}
TARGETS=${CG_TARGETS:-direct,nginx,pingora,sluice-pass,sluice}
SCENARIOS=${CG_SCENARIOS:-unary,stream,burst,paced}
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
SLUICE_BIN=$(abs "${SLUICE_BIN:-$ROOT/target/release/sluice}")
MOCK_BIN=$(abs "${MOCK_BIN:-$ROOT/target/release/sluice-mock-upstream}")
PINGORA_BIN=$(abs "${PINGORA_BIN:-$ROOT/target/release/pingora-smallest}")
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
KEY=sk-sluice-load-0001
MODEL=acme/chat
TOKENS=100

for tool in valgrind callgrind_control curl python3 bc; do
    command -v "$tool" >/dev/null || { echo "callgrind_targets: needs $tool" >&2; exit 2; }
done
[ -x "$MOCK_BIN" ] || { echo "callgrind_targets: no mock at $MOCK_BIN" >&2; exit 2; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TSV=$OUT/instructions.tsv
pids=()
stop_all() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
    done
    pids=()
}
trap stop_all EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

behavior() {
    case "$1" in
        burst) printf '{"tokens":%d,"token_delay_ms":0,"split":"burst"}' "$TOKENS" ;;
        paced) printf '{"tokens":%d,"token_delay_ms":%d}' "$TOKENS" "$PACED_DELAY_MS" ;;
        *) printf '{"tokens":%d,"token_delay_ms":0}' "$TOKENS" ;;
    esac
}

body() {
    local stream=true
    [ "$1" = unary ] && stream=false
    printf '{"model":"%s","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a short poem about load tests."}],"stream":%s,"max_tokens":256}' "$MODEL" "$stream"
}

# The mock in $1 (a folder), natively or (with $2 = valgrind) under callgrind; sets MOCK and
# MOCK_PID.
start_mock() {
    local dir=$1 how=${2:-native}
    : >"$dir/mock.out"
    if [ "$how" = valgrind ]; then
        (cd "$dir" && RUST_LOG=warn exec valgrind --tool=callgrind --collect-systime=yes \
            --callgrind-out-file="$dir/callgrind.out" \
            "$MOCK_BIN" --listen 127.0.0.1:0 --behavior "$(behavior unary)" \
            >"$dir/mock.out" 2>"$dir/mock.log") &
    else
        RUST_LOG=warn "$MOCK_BIN" --listen 127.0.0.1:0 --behavior "$(behavior unary)" \
            >"$dir/mock.out" 2>"$dir/mock.log" &
    fi
    MOCK_PID=$!
    pids+=("$MOCK_PID")
    MOCK=
    for _ in $(seq 1 1200); do   # at most 120 s (under valgrind)
        MOCK=$(sed -n 's/^listening on //p' "$dir/mock.out")
        [ -n "$MOCK" ] && return 0
        kill -0 "$MOCK_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "callgrind_targets: the mock did not start" >&2
    tail "$dir/mock.log" >&2
    exit 1
}

sluice_yaml() {
    local listen=$1 admin=$2 mock=$3 pass=$4
    cat <<EOF
server:
  listen: $listen
  admin_listen: $admin
  threads: 1
tenants:
  t: {}
virtual_keys:
  - key: $KEY
    tenant: t
providers:
  mock:
    kind: openai
    base_url: http://$mock/v1
    api_key: sk-provider-load
    health_check: {enabled: false}
models:
  $MODEL:
    routes:
      - provider: mock
        upstream_model: mock-small-v1
EOF
    if [ "$pass" = 1 ]; then
        printf 'passthrough:\n  - name: bench\n    path_prefix: /p/\n    upstreams: [%s]\n' "$mock"
    fi
}

nginx_conf() {
    local dir=$1 listen=$2 mock=$3 user=
    [ "$(id -u)" = 0 ] && user='user root;'
    cat <<EOF
$user
daemon off;
master_process off;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events {
    worker_connections 4096;
}
http {
    access_log $dir/access.log;
    client_body_temp_path $dir/client_body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    upstream mock {
        server $mock;
        keepalive 64;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }
    server {
        listen $listen;
        location / {
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 60s;
        }
    }
}
EOF
}

# Starts target $1 under callgrind in folder $2 (the mock already up, except for `direct`);
# sets URL (the request URL), VG (the callgrind process) and LISTEN.
start_target() {
    local name=$1 dir=$2 admin
    local vg=(valgrind --tool=callgrind --collect-systime=yes --callgrind-out-file="$dir/callgrind.out")
    LISTEN=127.0.0.1:$(free_port)
    case "$name" in
        direct)
            start_mock "$dir" valgrind
            VG=$MOCK_PID
            LISTEN=$MOCK
            URL=http://$MOCK/v1/chat/completions
            return 0 ;;
        nginx)
            mkdir -p "$dir/nginx"
            nginx_conf "$dir/nginx" "$LISTEN" "$MOCK" >"$dir/nginx/nginx.conf"
            (cd "$dir" && exec "${vg[@]}" "$NGINX_BIN" -p "$dir/nginx" -c "$dir/nginx/nginx.conf" \
                -e "$dir/nginx/error.log" >"$dir/target.out" 2>"$dir/target.log") &
            URL=http://$LISTEN/v1/chat/completions ;;
        pingora)
            (cd "$dir" && exec "${vg[@]}" "$PINGORA_BIN" "$LISTEN" "$MOCK" 1 \
                >"$dir/target.out" 2>"$dir/target.log") &
            URL=http://$LISTEN/v1/chat/completions ;;
        sluice|sluice-pass)
            admin=127.0.0.1:$(free_port)
            mkdir -p "$dir/conf"   # its own folder: Sluice watches its config's folder
            local pass=0
            [ "$name" = sluice-pass ] && pass=1
            sluice_yaml "$LISTEN" "$admin" "$MOCK" "$pass" >"$dir/conf/sluice.yaml"
            "$SLUICE_BIN" -t -c "$dir/conf/sluice.yaml" >/dev/null
            (cd "$dir" && RUST_LOG=info exec "${vg[@]}" "$SLUICE_BIN" -c "$dir/conf/sluice.yaml" \
                >"$dir/target.out" 2>"$dir/target.log") &
            if [ $pass = 1 ]; then
                URL=http://$LISTEN/p/v1/chat/completions
            else
                URL=http://$LISTEN/v1/chat/completions
            fi ;;
    esac
    VG=$!
    pids+=("$VG")
    for _ in $(seq 1 600); do   # at most 120 s for start-up under valgrind
        if curl -s -o /dev/null --max-time 2 "http://$LISTEN/" 2>/dev/null; then
            return 0
        fi
        kill -0 "$VG" 2>/dev/null || break
        sleep 0.2
    done
    echo "callgrind_targets: $name did not come up" >&2
    tail "$dir"/*.log "$dir"/nginx/error.log 2>/dev/null >&2
    exit 1
}

set_behavior() {
    local code
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 60 -X POST \
        -H 'content-type: application/json' --data-binary "$(behavior "$1")" \
        "http://$MOCK/_mock/behavior")
    [ "$code" = 200 ] || { echo "callgrind_targets: the mock refused behaviour $1 ($code)" >&2; exit 1; }
}

# $2 sequential requests of scenario $1 over one connection (one curl); the last answer is
# kept in $dir/last-$1.txt. Fails unless every answer is a 200 over one connection.
run() {
    local scen=$1 n=$2 dir=$3 cfg i out
    cfg="$dir/curl-$scen-$n.cfg"
    body "$scen" >"$dir/body-$scen.json"
    : >"$cfg"
    for i in $(seq 1 "$n"); do
        [ "$i" -gt 1 ] && echo 'next' >>"$cfg"
        out=/dev/null
        [ "$i" = "$n" ] && out="$dir/last-$scen.txt"
        {
            echo "url = \"$URL\""
            echo "header = \"authorization: Bearer $KEY\""
            echo "header = \"content-type: application/json\""
            echo "data-binary = \"@$dir/body-$scen.json\""
            echo "output = \"$out\""
            echo 'write-out = "%{http_code} %{num_connects}\n"'
            echo 'max-time = 60'
        } >>"$cfg"
    done
    timeout 1800 curl -s -K "$cfg" >"$dir/codes-$scen-$n.txt" || true
    local ok conns
    ok=$(grep -c '^200 ' "$dir/codes-$scen-$n.txt" || true)
    conns=$(awk '{s+=$2} END {print s+0}' "$dir/codes-$scen-$n.txt")
    if [ "$ok" != "$n" ] || [ "$conns" != 1 ]; then
        echo "callgrind_targets: $scen: $ok of $n answered 200 over $conns connection(s)" >&2
        exit 1
    fi
    if [ "$scen" != unary ] && ! tail -c 64 "$dir/last-$scen.txt" | grep -q 'data: \[DONE\]'; then
        echo "callgrind_targets: $scen: the stream did not end with [DONE]" >&2
        exit 1
    fi
}

ctl() {
    timeout 300 callgrind_control "$@" "$VG" >"$OUT/ctl.log" 2>&1 \
        || { cat "$OUT/ctl.log" >&2; exit 1; }
}

# Ir, sysCount, clock reads and allocations of one callgrind dump, tab-separated.
dump_costs() {
    python3 - "$1" <<'PY'
import re, sys
ALLOC = {"malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign",
         "valloc", "pvalloc"}
# glibc's malloc.c calling its own entry points (posix_memalign -> _mid_memalign -> malloc):
# the allocation was counted where it entered.
INSIDE = re.compile(r"(_int_|_mid_memalign|__libc_|tcache|sysmalloc|malloc_|alloc_perturb)")
# The clock reads that are vDSO calls natively (no system call) but system calls under
# valgrind, which gives its client no vDSO.
CLOCK = re.compile(r"(__)?(clock_gettime|gettimeofday|time|getcpu|sched_getcpu)(64|_syscall)?$")
names = {}
def name(spec):
    # `(id) name` defines a compressed name, `(id)` refers to it; a `'N` suffix marks a
    # recursion level (`--separate-recs`), `@@GLIBC_x` a symbol version.
    m = re.match(r"\((\d+)\)(?: (.*))?$", spec)
    if m:
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        spec = names.get(m.group(1), "")
    return re.sub(r"(@.*|'\d+)$", "", spec)
events, summary, fn, cfn, allocs, clocks = [], [], "", "", 0, 0
with open(sys.argv[1], errors="replace") as f:
    for line in f:
        if line.startswith("fn="):
            fn = name(line[3:].rstrip("\n"))
        elif line.startswith("cfn="):
            cfn = name(line[4:].rstrip("\n"))
        elif line.startswith("calls="):
            n = int(line[6:].split()[0])
            if cfn in ALLOC and fn not in ALLOC and not INSIDE.match(fn):
                allocs += n
            elif CLOCK.match(cfn) and not CLOCK.match(fn):
                clocks += n
        elif line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            summary = [int(x) for x in line.split()[1:]]
cost = dict(zip(events, summary))
print(f"{cost.get('Ir', 0)}\t{cost.get('sysCount', 0)}\t{clocks}\t{allocs}")
PY
}

# Requests of scenario $1 for a count of $2: a tenth for `paced` (at least 2).
count() {
    if [ "$1" = paced ]; then echo $(( $2 / 10 > 2 ? $2 / 10 : 2 )); else echo "$2"; fi
}

dump_file() { grep -l "^desc: Trigger: dump $2\$" "$1"/callgrind.out* | head -1; }

IFS=, read -ra target_list <<<"$TARGETS"
IFS=, read -ra scen_list <<<"$SCENARIOS"
printf 'target\tscenario\trequests\tevents_per_req\tseconds\tIr\tsysCount\tclock_reads\tallocs\tidle_seconds\tidle_Ir\tidle_sysCount\tidle_clock_reads\tidle_allocs\tIr_per_req\tIr_per_event\tallocs_per_req\tsyscalls_per_req\tclock_reads_per_req\n' >"$TSV"
notes=()

for target in "${target_list[@]}"; do
    case "$target" in
        direct) ;;
        nginx) [ -x "$NGINX_BIN" ] || { notes+=("nginx: no $NGINX_BIN; skipped"); continue; } ;;
        pingora) [ -x "$PINGORA_BIN" ] || { notes+=("pingora: no $PINGORA_BIN (cargo build --release -p pingora-smallest); skipped"); continue; } ;;
        sluice|sluice-pass) [ -x "$SLUICE_BIN" ] || { notes+=("$target: no $SLUICE_BIN; skipped"); continue; } ;;
        *) echo "callgrind_targets: unknown target $target" >&2; exit 2 ;;
    esac
    dir=$OUT/$target
    rm -rf "$dir"; mkdir -p "$dir"
    echo "callgrind_targets: $target" >&2
    [ "$target" = direct ] || start_mock "$dir"
    start_target "$target" "$dir"
    for scen in "${scen_list[@]}"; do
        set_behavior "$scen"
        run "$scen" "$(count "$scen" "$WARM")" "$dir"
    done
    sleep 0.5   # the warm-up connection's close, before the zero
    declare -A secs=()
    for scen in "${scen_list[@]}"; do
        set_behavior "$scen"
        ctl -z
        t0=$(date +%s.%N)
        run "$scen" "$(count "$scen" "$N")" "$dir"
        sleep 0.3   # the connection's close belongs to the phase
        ctl -d "$scen"
        t1=$(date +%s.%N)
        secs[$scen]=$(echo "$t1 - $t0" | bc -l)
    done
    ctl -z
    t0=$(date +%s.%N)
    sleep "$IDLE_S"
    ctl -d idle
    t1=$(date +%s.%N)
    idle_s=$(echo "$t1 - $t0" | bc -l)
    read -r iir isys iclk ialloc < <(dump_costs "$(dump_file "$dir" idle)")
    stop_all
    for scen in "${scen_list[@]}"; do
        read -r ir sys clk allocs < <(dump_costs "$(dump_file "$dir" "$scen")")
        events=0
        [ "$scen" = unary ] || events=$(grep -c '^data:' "$dir/last-$scen.txt" || true)
        python3 - "$target" "$scen" "$(count "$scen" "$N")" "$events" "${secs[$scen]}" \
            "$ir" "$sys" "$clk" "$allocs" "$idle_s" "$iir" "$isys" "$iclk" "$ialloc" \
            >>"$TSV" <<'PY'
import sys
t, s, n, ev, secs, ir, sy, clk, al, idle_s, iir, isy, iclk, ial = sys.argv[1:]
n, ev, secs, idle_s = int(n), int(ev), float(secs), float(idle_s)
ir, sy, clk, al, iir, isy, iclk, ial = map(int, (ir, sy, clk, al, iir, isy, iclk, ial))
# Per request: the phase's count minus the idle phase's rate x the phase's seconds.
net = lambda x, i: (x - i / idle_s * secs) / n
ir_req = net(ir, iir)
ir_ev = f"{ir_req / ev:.0f}" if ev else "-"
print(f"{t}\t{s}\t{n}\t{ev}\t{secs:.2f}\t{ir}\t{sy}\t{clk}\t{al}\t{idle_s:.2f}\t{iir}\t{isy}\t"
      f"{iclk}\t{ial}\t{ir_req:.0f}\t{ir_ev}\t{net(al, ial):.2f}\t{net(sy - clk, isy - iclk):.2f}\t"
      f"{net(clk, iclk):.2f}")
PY
    done
done

echo
echo "Per request (minus the idle background), N=$N after $WARM warm-up requests per scenario:"
column -t -s $'\t' "$TSV" 2>/dev/null || cat "$TSV"
for n in "${notes[@]}"; do echo "note: $n"; done
