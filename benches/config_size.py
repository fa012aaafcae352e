#!/usr/bin/env python3
"""What a config's size costs at rest (issue 31, item 4; benches/README.md, "Config-size
independence (issue 31)").

    benches/config_size.py SLUICE_BIN MOCK_BIN TENANTS MODELS [IDLE_SECONDS]

Starts the mock and Sluice (loopback only) with a generated config of TENANTS tenants (one
virtual key and a request limit each) x MODELS standard models (two priced routes each, both
at the mock), and prints, one `key=value` a line: the start time (spawn to `/readyz`), RSS
after start, six requests from three tenants, RSS after them, one `/metrics` scrape (time,
bytes, lines), RSS after it, and the process's own CPU (utime+stime of /proc/PID/stat) over
IDLE_SECONDS (default 10) without traffic, as % of one core. `TENANTS=0 MODELS=0` runs the
shipped default config (`conf/sluice.yaml`'s shape: one tenant, one model) instead. Every wait
is bounded; both processes are killed at the end.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def key(i):
    return f"sk-sluice-tenant{i:04}-key"


def config(mock, listen, admin, tenants, models):
    y = [f"server:\n  listen: {listen}\n  admin_listen: {admin}\n  threads: 2\ntenants:\n"]
    for t in range(max(tenants, 1)):
        y.append(f"  t{t:04}: {{requests_per_minute: 6000}}\n")
    y.append("virtual_keys:\n")
    for t in range(max(tenants, 1)):
        y.append(f"  - {{key: {key(t)}, tenant: t{t:04}}}\n")
    y.append(
        f"providers:\n  p1: {{kind: openai, base_url: http://{mock}/v1, api_key: sk-p1, health_check: {{enabled: false}}}}\n"
        f"  p2: {{kind: openai, base_url: http://{mock}/v1, api_key: sk-p2, health_check: {{enabled: false}}}}\nmodels:\n"
    )
    for m in range(max(models, 1)):
        y.append(
            f"  acme/m{m:03}:\n    input_usd_per_mtok: 2\n    output_usd_per_mtok: 8\n    routes:\n"
            "      - {provider: p1, upstream_model: mock-small-v1, priority: 1, input_usd_per_mtok: 1, output_usd_per_mtok: 4}\n"
            "      - {provider: p2, upstream_model: mock-small-v1, priority: 2, input_usd_per_mtok: 1, output_usd_per_mtok: 4}\n"
        )
    return "".join(y)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def thread_ticks(pid):
    """{(tid, name): utime+stime} of every thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            rest = stat.rsplit(")", 1)[1].split()
            out[(tid, name)] = int(rest[11]) + int(rest[12])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def get(url, timeout=60):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def chat(listen, tenant, model):
    body = json.dumps(
        {"model": f"acme/m{model:03}", "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    req = urllib.request.Request(
        f"http://{listen}/v1/chat/completions",
        data=body,
        headers={"authorization": f"Bearer {key(tenant)}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


def main():
    sluice_bin, mock_bin, tenants, models = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    idle_s = float(sys.argv[5]) if len(sys.argv) > 5 else 10.0
    work = tempfile.mkdtemp(prefix="sluice-config-size-")
    procs = []
    try:
        mock_out = open(os.path.join(work, "mock.out"), "w+")
        mock = subprocess.Popen(
            [mock_bin, "--listen", "127.0.0.1:0", "--behavior", '{"tokens":20}'],
            stdout=mock_out, stderr=subprocess.DEVNULL,
        )
        procs.append(mock)
        mock_addr = None
        for _ in range(100):
            mock_out.seek(0)
            for line in mock_out.read().splitlines():
                if line.startswith("listening on "):
                    mock_addr = line.split()[-1]
            if mock_addr:
                break
            time.sleep(0.1)
        assert mock_addr, "mock did not start"
        listen, admin = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        path = os.path.join(work, "sluice.yaml")
        with open(path, "w") as f:
            f.write(config(mock_addr, listen, admin, tenants, models))
        t0 = time.monotonic()
        env = dict(os.environ, RUST_LOG="info")
        sluice = subprocess.Popen(
            [sluice_bin, "-c", path], cwd=work, env=env,
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "sluice.log"), "w"),
        )
        procs.append(sluice)
        for _ in range(1200):
            try:
                if get(f"http://{admin}/readyz", timeout=1)[0] == 200:
                    break
            except Exception:
                time.sleep(0.05)
        else:
            raise SystemExit("sluice did not become ready")
        print(f"start_s={time.monotonic() - t0:.2f}")
        time.sleep(1)
        print(f"rss_start_kib={rss_kib(sluice.pid)}")
        n = max(tenants, 1)
        m = max(models, 1)
        for t, mo in [(0, 0), (0, 1 % m), (n // 2, 0), (n // 2, 42 % m), (n - 1, m - 1), (n - 1, max(m - 2, 0))]:
            assert chat(listen, t, mo) == 200
        print(f"rss_after_requests_kib={rss_kib(sluice.pid)}")
        t1 = time.monotonic()
        status, text = get(f"http://{admin}/metrics")
        lines = text.count(b"\n")
        print(f"scrape_s={time.monotonic() - t1:.3f} scrape_bytes={len(text)} scrape_lines={lines}")
        print(f"rss_after_scrape_kib={rss_kib(sluice.pid)}")
        time.sleep(2)
        c0, w0, th0 = cpu_ticks(sluice.pid), time.monotonic(), thread_ticks(sluice.pid)
        time.sleep(idle_s)
        c1, w1, th1 = cpu_ticks(sluice.pid), time.monotonic(), thread_ticks(sluice.pid)
        hz = os.sysconf("SC_CLK_TCK")
        print(f"idle_cpu_pct={(c1 - c0) / hz / (w1 - w0) * 100:.2f} over {w1 - w0:.1f} s")
        busy = {}
        for k, v in th1.items():
            busy[k[1]] = busy.get(k[1], 0) + v - th0.get(k, 0)
        print("idle_ticks_by_thread=" + ",".join(f"{n}:{t}" for n, t in sorted(busy.items(), key=lambda x: -x[1]) if t))
        print(f"rss_idle_kib={rss_kib(sluice.pid)}")
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)


if __name__ == "__main__":
    main()
