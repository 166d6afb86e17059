// Unit tests of the static test-page server (no browser needed).
// Run: node --test tests/support/

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startStaticServer } from './static-server.mjs';

let server;
before(async () => {
  server = await startStaticServer();
});
after(async () => {
  await server.close();
});

test('serves the test page and its assets from 127.0.0.1 with content types', async () => {
  assert.match(server.origin, /^http:\/\/127\.0\.0\.1:\d+$/);
  const page = await fetch(server.url('shop.html'));
  assert.equal(page.status, 200);
  assert.match(page.headers.get('content-type'), /^text\/html/);
  const html = await page.text();
  assert.match(html, /<h1>Acme Newsletter<\/h1>/);
  assert.match(html, /SECRET HIDDEN TEXT/);
  for (const name of ['Subscribe', 'Unsubscribe', 'Contact']) assert.match(html, new RegExp(`>${name}</button>`));
  const script = await fetch(server.url('shop.js'));
  assert.match(script.headers.get('content-type'), /^text\/javascript/);
  assert.match(await script.text(), /subscribeClicks/);
});

test('missing files are 404 and nothing outside the root is served', async () => {
  assert.equal((await fetch(server.url('nope.html'))).status, 404);
  assert.equal((await fetch(`${server.origin}/..%2fstatic-server.mjs`)).status, 403);
  assert.equal((await fetch(`${server.origin}/..%2f..%2fpackage.json`)).status, 403);
  assert.equal((await fetch(server.url('shop.html'), { method: 'POST' })).status, 405);
});

test('no-content, download and redirect answers for navigation tests', async () => {
  const empty = await fetch(`${server.origin}/__no-content`);
  assert.equal(empty.status, 204);
  assert.equal(await empty.text(), '');
  const file = await fetch(`${server.origin}/__download/report.txt`);
  assert.equal(file.status, 200);
  assert.equal(file.headers.get('content-disposition'), 'attachment; filename="report.txt"');
  assert.equal(await file.text(), 'downloaded\n');
  const moved = await fetch(`${server.origin}/__redirect/archive.html`, { redirect: 'manual' });
  assert.equal(moved.status, 302);
  assert.equal(moved.headers.get('location'), '/archive.html');
  const followed = await fetch(`${server.origin}/__redirect/archive.html`);
  assert.equal(followed.url, server.url('archive.html'));
});

test('a closed gate holds its requests until the test opens it; unknown gates answer at once', async () => {
  const unknown = await fetch(`${server.origin}/__gate/never-closed`);
  assert.equal(unknown.status, 200);
  assert.equal(await unknown.text(), 'open');

  const gate = server.gate('unit-test');
  assert.equal(gate.arrivals(), 0);
  let answered = false;
  const held = fetch(gate.url).then(async (response) => {
    answered = true;
    return { status: response.status, text: await response.text() };
  });
  assert.equal(await gate.waitForArrivals(1, { timeout: 10000 }), 1);
  // The request arrived; it stays unanswered while the gate is closed.
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(answered, false);
  assert.equal(gate.isOpen(), false);
  gate.open();
  assert.deepEqual(await held, { status: 200, text: 'open' });
  assert.equal(gate.isOpen(), true);
  // Open now: later requests pass and still count.
  assert.equal((await fetch(gate.url)).status, 200);
  assert.equal(gate.arrivals(), 2);
  await assert.rejects(gate.waitForArrivals(3, { timeout: 50 }), /timed out waiting for 3 arrival/);
  assert.throws(() => server.gate('../x'), /gate names/);
});
