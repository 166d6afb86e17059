// Tiny static file server for the local test pages (tests/pages by default).
//
// Owns: serving files under one root directory on 127.0.0.1 with a content
// type and no caching. Must not: listen on another address, serve anything
// outside its root, or depend on any package.
//
// In-process: `startStaticServer({ root, port })` → { origin, url(path), close }.
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
    async close() {
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
