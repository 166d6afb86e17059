// Tiny static file server for the local test pages (tests/pages by default).
//
// Owns: serving files under one root directory on 127.0.0.1 with a content
// type and no caching, and named test gates. Must not: listen on another
// address, serve anything outside its root, or depend on any package.
//
// In-process: `startStaticServer({ root, port })` → { origin, url(path), gate(name), close }.
//
// Gates let a test hold a page at a known point without timing: a page
// requests `GET /__gate/<name>` (e.g. with a synchronous XHR inside a click
// handler) and the response comes only once the test opens the gate.
// `server.gate(name)` closes the gate and returns { arrivals(),
// waitForArrivals(n, { timeout }), open() }. A gate the test never closed
// (or already opened) answers at once, so the pages also work on their own.
//
// Answers that leave a browser tab where it was, for navigation tests:
// `GET /__no-content` is 204 No Content, `GET /__download/<name>` is a small
// text file sent as an attachment (a download). `GET /__redirect/<path>`
// redirects (302) to /<path>.
// CLI: node tests/support/static-server.mjs [--port N] [--root DIR]
//      prints `STATIC_URL=http://127.0.0.1:<port>/` as its first stdout line.

import http from 'node:http';
import { readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HOST = '127.0.0.1';
const DEFAULT_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'pages');

const CONTENT_TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.txt': 'text/plain; charset=utf-8',
};

/**
 * @param {{ root?: string, port?: number }} [options]
 */
export async function startStaticServer(options = {}) {
  const root = path.resolve(options.root ?? DEFAULT_ROOT);
  /** name → { open, arrivals, held: response[], waiters: Set } */
  const gates = new Map();
  const gateEntry = (name) => {
    let entry = gates.get(name);
    if (!entry) {
      entry = { open: true, arrivals: 0, held: [], waiters: new Set() };
      gates.set(name, entry);
    }
    return entry;
  };
  const releaseGate = (entry) => {
    entry.open = true;
    for (const respond of entry.held.splice(0)) respond();
  };
  const server = http.createServer(async (req, res) => {
    const send = (status, body, type = 'text/plain; charset=utf-8') => {
      res.writeHead(status, { 'Content-Type': type, 'Cache-Control': 'no-store' });
      res.end(body);
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      send(405, 'method not allowed');
      return;
    }
    let pathname;
    try {
      pathname = decodeURIComponent(new URL(req.url, `http://${HOST}`).pathname);
    } catch {
      send(400, 'bad path');
      return;
    }
    const gateMatch = /^\/__gate\/([\w-]+)$/.exec(pathname);
    if (gateMatch) {
      const entry = gateEntry(gateMatch[1]);
      entry.arrivals += 1;
      for (const waiter of [...entry.waiters]) waiter();
      const respond = () => send(200, 'open');
      if (entry.open) respond();
      else entry.held.push(respond);
      return;
    }
    if (pathname === '/__no-content') {
      res.writeHead(204, { 'Cache-Control': 'no-store' });
      res.end();
      return;
    }
    const downloadMatch = /^\/__download\/([\w.-]+)$/.exec(pathname);
    if (downloadMatch) {
      res.writeHead(200, {
        'Content-Type': 'application/octet-stream',
        'Content-Disposition': `attachment; filename="${downloadMatch[1]}"`,
        'Cache-Control': 'no-store',
      });
      res.end('downloaded\n');
      return;
    }
    const redirectMatch = /^\/__redirect\/([\w./-]+)$/.exec(pathname);
    if (redirectMatch) {
      res.writeHead(302, { Location: `/${redirectMatch[1].replace(/^\/+/, '')}`, 'Cache-Control': 'no-store' });
      res.end();
      return;
    }
    if (pathname.endsWith('/')) pathname += 'index.html';
    const file = path.resolve(root, `.${pathname}`);
    if (file !== root && !file.startsWith(root + path.sep)) {
      send(403, 'forbidden');
      return;
    }
    try {
      const info = await stat(file);
      if (!info.isFile()) throw new Error('not a file');
      const body = await readFile(file);
      const type = CONTENT_TYPES[path.extname(file).toLowerCase()] ?? 'application/octet-stream';
      res.writeHead(200, { 'Content-Type': type, 'Content-Length': body.length, 'Cache-Control': 'no-store' });
      res.end(req.method === 'HEAD' ? undefined : body);
    } catch {
      send(404, 'not found');
    }
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, HOST, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const origin = `http://${HOST}:${server.address().port}`;
  return {
    origin,
    root,
    /** Absolute URL of a page under the root, e.g. url('shop.html'). */
    url(relative = '') {
      return `${origin}/${String(relative).replace(/^\/+/, '')}`;
    },
    /** Closes gate `name` (requests to /__gate/<name> wait until open()). */
    gate(name) {
      if (!/^[\w-]+$/.test(name)) throw new Error(`gate names are word characters and dashes: ${name}`);
      const entry = gateEntry(name);
      entry.open = false;
      return {
        name,
        url: `${origin}/__gate/${name}`,
        arrivals: () => entry.arrivals,
        isOpen: () => entry.open,
        /** Resolves once `count` requests reached the gate (open or not). */
        waitForArrivals(count = 1, { timeout = 60000 } = {}) {
          return new Promise((resolve, reject) => {
            const check = () => {
              if (entry.arrivals < count) return;
              entry.waiters.delete(check);
              clearTimeout(timer);
              resolve(entry.arrivals);
            };
            const timer = setTimeout(() => {
              entry.waiters.delete(check);
              reject(new Error(`static-server: gate ${name}: timed out waiting for ${count} arrival(s) (got ${entry.arrivals})`));
            }, timeout);
            entry.waiters.add(check);
            check();
          });
        },
        /** Answers every held request and lets later ones through at once. */
        open() {
          releaseGate(entry);
        },
      };
    },
    async close() {
      for (const entry of gates.values()) releaseGate(entry);
      if (typeof server.closeAllConnections === 'function') server.closeAllConnections();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const argv = process.argv.slice(2);
  let port = 0;
  let root;
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === '--port') port = Number(argv[++i]);
    else if (argv[i] === '--root') root = argv[++i];
    else {
      process.stderr.write(`static-server: unknown argument ${argv[i]}\n`);
      process.exit(2);
    }
  }
  const server = await startStaticServer({ port, root });
  process.stdout.write(`STATIC_URL=${server.origin}/\n`);
  const stop = async () => {
    await server.close();
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
