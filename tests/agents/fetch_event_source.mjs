// `@microsoft/fetch-event-source` (the usual way to stream SSE from a POST in a browser)
// against a resumable Sluice stream, for tests/e2e/resumable.rs. The request goes through a
// loopback TCP relay that cuts the first connection once the client got CUT_AFTER events;
// the library then reconnects as it does by itself: the same POST again, with the
// `last-event-id` header of the last event it saw.
// Usage: node fetch_event_source.mjs SLUICE_ADDR KEY MODEL CUT_AFTER
// Prints one JSON line `{connections, ids, data, errors}` and exits 0; a failure exits 1.
import net from 'node:net';
import { fetchEventSource } from '@microsoft/fetch-event-source';

// The library is written for browsers: it times its retries with `window` and removes a
// `document` visibility listener when done (even with `openWhenHidden`).
globalThis.window ??= globalThis;
globalThis.document ??= { hidden: false, addEventListener() {}, removeEventListener() {} };

const [addr, key, model, cutAfter] = process.argv.slice(2);
if (!cutAfter) {
  console.error('usage: node fetch_event_source.mjs SLUICE_ADDR KEY MODEL CUT_AFTER');
  process.exit(2);
}
const [host, port] = [addr.slice(0, addr.lastIndexOf(':')), Number(addr.slice(addr.lastIndexOf(':') + 1))];
if (host !== '127.0.0.1') {
  console.error(`loopback only, not ${host}`);
  process.exit(2);
}

let connections = 0;
const relay = net.createServer((client) => {
  connections += 1;
  const first = connections === 1;
  const upstream = net.connect(port, host);
  let seen = 0;
  client.on('data', (d) => upstream.write(d));
  upstream.on('data', (d) => {
    client.write(d);
    if (first) {
      seen += d.toString('latin1').split('\nid: ').length - 1;
      if (seen >= Number(cutAfter)) {
        // The network goes: both sides are cut at once.
        client.destroy();
        upstream.destroy();
      }
    }
  });
  client.on('error', () => upstream.destroy());
  upstream.on('error', () => client.destroy());
  client.on('close', () => upstream.destroy());
  upstream.on('close', () => client.destroy());
});
await new Promise((resolve) => relay.listen(0, '127.0.0.1', resolve));

const ids = [];
const data = [];
let errors = 0;
const ctrl = new AbortController();
const deadline = setTimeout(() => ctrl.abort(), 20000);
try {
  await fetchEventSource(`http://127.0.0.1:${relay.address().port}/v1/chat/completions`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${key}`,
      'content-type': 'application/json',
      'x-sluice-resumable': 'true',
    },
    body: JSON.stringify({
      model,
      stream: true,
      messages: [{ role: 'user', content: 'tell me the plan' }],
    }),
    openWhenHidden: true,
    signal: ctrl.signal,
    async onopen(res) {
      if (res.status !== 200) throw new Error(`status ${res.status}: ${await res.text()}`);
    },
    onmessage(ev) {
      ids.push(ev.id);
      data.push(ev.data);
    },
    onerror(err) {
      errors += 1;
      if (errors > 3) throw err;
      return 50; // retry after 50 ms
    },
  });
} catch (e) {
  console.error(`fetch-event-source failed: ${e?.stack ?? e}`);
  process.exit(1);
} finally {
  clearTimeout(deadline);
  relay.close();
}
console.log(JSON.stringify({ connections, ids, data, errors }));
process.exit(0);
