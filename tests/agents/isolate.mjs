// Runs one client inside the loopback-only network namespace of tests/e2e/agents.rs, where
// Sluice is reachable only through a Unix socket (sockets on the file system cross network
// namespaces; TCP does not).
//
// Usage: node isolate.mjs PORT UNIX_SOCKET TRAP_PORT TRAP_LOG -- COMMAND [ARGS...]
//
// - 127.0.0.1:PORT forwards every connection to UNIX_SOCKET (the test forwards that to
//   Sluice): the client's base URL is http://127.0.0.1:PORT.
// - 127.0.0.1:TRAP_PORT is the client's HTTP(S)_PROXY: every connection there is an attempt
//   to reach another host. Its first line (`CONNECT host:443 HTTP/1.1`, or a proxied
//   request line) is appended to TRAP_LOG and answered 403; the test fails on any line.
// - COMMAND runs with this process's environment and stdio; this process exits with its
//   exit code (128 + signal number when it was killed), and passes SIGTERM/SIGINT on.
import { spawn } from 'node:child_process';
import { appendFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';

const args = process.argv.slice(2);
const sep = args.indexOf('--');
if (sep !== 4 || args.length < 6) {
  console.error('usage: node isolate.mjs PORT UNIX_SOCKET TRAP_PORT TRAP_LOG -- COMMAND [ARGS...]');
  process.exit(2);
}
const [port, socketPath, trapPort, trapLog] = args.slice(0, 4);
const [command, ...commandArgs] = args.slice(5);

const bridge = net.createServer((client) => {
  const upstream = net.createConnection({ path: socketPath });
  client.pipe(upstream);
  upstream.pipe(client);
  const close = () => { client.destroy(); upstream.destroy(); };
  client.on('error', close);
  upstream.on('error', close);
});

const trap = net.createServer((conn) => {
  let seen = '';
  let logged = false;
  const record = (why) => {
    if (logged) return;
    logged = true;
    const line = seen.split('\r\n')[0].slice(0, 300) || `(${why})`;
    appendFileSync(trapLog, `${line}\n`);
  };
  conn.on('data', (d) => {
    seen += d.toString('latin1');
    if (seen.includes('\r\n')) {
      record('line');
      conn.end('HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
    }
  });
  conn.on('end', () => record('closed before a request line'));
  conn.on('error', () => record('connection error'));
  conn.setTimeout(5000, () => { record('silent'); conn.destroy(); });
});

const listen = (server, p) => new Promise((resolve, reject) => {
  server.once('error', reject);
  server.listen(Number(p), '127.0.0.1', resolve);
});
try {
  await listen(bridge, port);
  await listen(trap, trapPort);
} catch (e) {
  console.error(`isolate.mjs: cannot listen: ${e.message}`);
  process.exit(2);
}

const child = spawn(command, commandArgs, { stdio: 'inherit' });
for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => child.kill(sig));
child.on('error', (e) => {
  console.error(`isolate.mjs: cannot run ${command}: ${e.message}`);
  process.exit(127);
});
child.on('exit', (code, signal) => {
  process.exit(code ?? 128 + (os.constants.signals[signal] ?? 9));
});
