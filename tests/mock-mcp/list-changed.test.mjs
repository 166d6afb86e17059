// Tests of the mock MCP server's server-initiated event stream (GET /mcp)
// and `notifications/tools/list_changed`: what the engine's MCP client is
// tested against must behave like a Streamable HTTP server that offers one.
//
// Run:  node --test tests/mock-mcp/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startMockMcp } from './server.mjs';
import { eventReader, messages, post, session } from './client.mjs';

const LIST_CHANGED = 'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n\n';

/** Opens a GET event stream (with the session's headers unless told otherwise). */
async function get(mock, { session, version = '2025-06-18', accept = 'text/event-stream', signal } = {}) {
  const headers = {};
  if (accept) headers.accept = accept;
  if (session) headers['mcp-session-id'] = session;
  if (session && version) headers['mcp-protocol-version'] = version;
  return fetch(mock.url, { method: 'GET', headers, signal });
}

/** Fails instead of hanging when `promise` takes more than `ms`. */
function within(promise, ms, what) {
  let timer;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise((_, rejectLate) => {
      timer = setTimeout(() => rejectLate(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    }),
  ]);
}

async function listAll(mock, s) {
  const names = [];
  const tools = [];
  let cursor;
  do {
    const [answer] = await messages(await post(mock, { jsonrpc: '2.0', id: 50, method: 'tools/list', params: cursor ? { cursor } : {} }, { session: s.id }));
    tools.push(...answer.result.tools);
    names.push(...answer.result.tools.map((t) => t.name));
    cursor = answer.result.nextCursor;
  } while (cursor);
  return { names, tools };
}

const call = (id, name, args = {}) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } });

test('a_get_stream_opens_for_a_valid_session_and_its_close_is_logged', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  assert.deepEqual(s.capabilities, { tools: { listChanged: true } });

  const controller = new AbortController();
  const response = await get(mock, { session: s.id, signal: controller.signal });
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type'), /^text\/event-stream/);
  const stream = eventReader(response);
  assert.equal(await within(stream.saw(': open\n\n'), 5000, 'the opening comment'), true);
  assert.equal(stream.raw(), ': open\n\n', 'a comment, at once');

  const [entry] = mock.streams();
  assert.equal(entry.kind, 'stream');
  assert.equal(entry.method, 'GET');
  assert.equal(entry.status, 200);
  assert.equal(entry.session, s.id);
  assert.equal(entry.stream, 1);
  assert.equal(entry.closed, false);
  assert.equal(entry.headers['mcp-protocol-version'], '2025-06-18');
  assert.equal(mock.streamCount(), 1);
  assert.equal(mock.streamCount(s.id), 1);
  assert.equal(mock.streamCount('other'), 0);

  // Several per session; a 2025-03-26 session may leave the version out.
  const second = eventReader(await get(mock, { session: s.id }));
  const old = await session(mock, '2025-03-26');
  const third = await get(mock, { session: old.id, version: null });
  assert.equal(third.status, 200);
  assert.equal(mock.streamCount(), 3);
  assert.equal(mock.streamCount(s.id), 2);

  // The client closes the first.
  controller.abort();
  await mock.waitFor(() => entry.closed, { timeout: 5000, message: 'the stream to be closed' });
  assert.equal(entry.closedBy, 'client');
  assert.equal(typeof entry.closedAt, 'number');
  assert.equal(mock.streamCount(), 2);
  await second.cancel();
  await third.body.cancel();
  await mock.waitFor(() => mock.streamCount() === 0, { timeout: 5000, message: 'every stream closed' });
  assert.deepEqual(mock.streams().map((e) => [e.stream, e.closed, e.closedBy]), [[1, true, 'client'], [2, true, 'client'], [3, true, 'client']]);
});

test('a_get_is_refused_without_a_session_or_the_event_stream_accept_and_405_without_list_changed', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  assert.equal((await get(mock, { session: s.id, accept: 'application/json' })).status, 406);
  assert.equal((await get(mock, { session: s.id, accept: null })).status, 406);
  assert.equal((await get(mock, { session: 'nope' })).status, 404);
  assert.equal((await get(mock)).status, 400, 'no session id');
  assert.equal((await get(mock, { session: s.id, version: null })).status, 400, 'no MCP-Protocol-Version');
  assert.equal((await get(mock, { session: s.id, version: '2025-03-26' })).status, 400, 'another version than the session\'s');
  mock.setDown(503);
  assert.equal((await get(mock, { session: s.id })).status, 503);
  mock.setDown(null);
  assert.equal(mock.streamCount(), 0);
  const refused = mock.log().filter((e) => e.kind === 'rejected' && e.method === 'GET');
  assert.deepEqual(refused.map((e) => e.status), [406, 406, 404, 400, 400, 400, 503]);
  assert.deepEqual(mock.streams(), []);

  const quiet = await startMockMcp({ listChanged: false });
  t.after(() => quiet.close());
  const q = await session(quiet);
  assert.deepEqual(q.capabilities, { tools: { listChanged: false } });
  const refusedGet = await get(quiet, { session: q.id });
  assert.equal(refusedGet.status, 405);
  await refusedGet.text();
  assert.equal(quiet.notifyListChanged(), 0);
  assert.equal(quiet.setTools([]), 0);
});

test('set_tools_notifies_every_open_stream_and_the_next_list_shows_the_new_tools', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const a = await session(mock);
  const b = await session(mock);
  const readers = [
    eventReader(await get(mock, { session: a.id })),
    eventReader(await get(mock, { session: a.id })),
    eventReader(await get(mock, { session: b.id })),
  ];
  assert.equal(mock.streamCount(), 3);
  assert.equal((await listAll(mock, a)).names.length, 8);

  const only = [{ name: 'only', description: 'The one tool.', inputSchema: { type: 'object', properties: {} }, run: () => ({ content: [{ type: 'text', text: 'only' }] }) }];
  assert.equal(mock.setTools(only), 3);
  for (const reader of readers) {
    assert.deepEqual(await within(reader.next(), 5000, 'list_changed'), { jsonrpc: '2.0', method: 'notifications/tools/list_changed' });
    assert.ok(reader.raw().endsWith(LIST_CHANGED), 'written as the transport says');
  }
  const sent = mock.sent();
  assert.deepEqual(sent.map((e) => [e.kind, e.method, e.session, e.stream]), [
    ['sent', 'notifications/tools/list_changed', a.id, 1],
    ['sent', 'notifications/tools/list_changed', a.id, 2],
    ['sent', 'notifications/tools/list_changed', b.id, 3],
  ]);
  assert.deepEqual((await listAll(mock, a)).names, ['only']);
  assert.deepEqual(mock.toolNames(), ['only']);

  // Without notify: the list changes, nothing is sent.
  assert.equal(mock.setTools([...only, { ...only[0], name: 'second' }], { notify: false }), 0);
  assert.equal(mock.sent().length, 3);
  assert.deepEqual((await listAll(mock, b)).names, ['only', 'second']);
  // What the streams get next is the next notification: nothing came between.
  assert.equal(mock.notifyListChanged(), 3);
  for (const reader of readers) {
    assert.equal((await within(reader.next(), 5000, 'list_changed')).method, 'notifications/tools/list_changed');
    assert.equal(reader.raw(), `: open\n\n${LIST_CHANGED}${LIST_CHANGED}`);
  }
});

test('notify_list_changed_close_streams_and_stream_count', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  assert.equal(mock.notifyListChanged(), 0, 'no stream open');
  const one = eventReader(await get(mock, { session: s.id }));
  const two = eventReader(await get(mock, { session: s.id }));
  assert.equal(mock.streamCount(), 2);
  assert.equal(mock.notifyListChanged(), 2);
  assert.equal((await one.next()).method, 'notifications/tools/list_changed');
  assert.equal((await two.next()).method, 'notifications/tools/list_changed');
  assert.equal(mock.toolNames().length, 8, 'the tools unchanged');

  assert.equal(mock.closeStreams(), 2);
  assert.equal(mock.streamCount(), 0, 'at once');
  assert.equal(await within(one.next(), 5000, 'the end of the stream'), null);
  assert.equal(await within(two.next(), 5000, 'the end of the stream'), null);
  assert.deepEqual(mock.streams().map((e) => [e.closed, e.closedBy]), [[true, 'server'], [true, 'server']]);
  assert.equal(mock.closeStreams(), 0);
  assert.equal(mock.notifyListChanged(), 0);

  // A forgotten session's streams end; so do a deleted session's.
  const three = eventReader(await get(mock, { session: s.id }));
  mock.expireSessions();
  assert.equal(mock.streamCount(), 0);
  assert.equal(await within(three.next(), 5000, 'the end of an expired session\'s stream'), null);
  assert.equal((await get(mock, { session: s.id })).status, 404);

  const kept = await session(mock);
  const gone = await session(mock);
  const keptStream = eventReader(await get(mock, { session: kept.id }));
  const goneStream = eventReader(await get(mock, { session: gone.id }));
  const deleted = await fetch(mock.url, { method: 'DELETE', headers: { 'mcp-session-id': gone.id, 'mcp-protocol-version': '2025-06-18' } });
  assert.equal(deleted.status, 200);
  assert.equal(await within(goneStream.next(), 5000, 'the end of a deleted session\'s stream'), null);
  assert.equal(mock.streamCount(), 1);
  assert.equal(mock.streamCount(kept.id), 1);

  // reset() ends them too.
  mock.reset();
  assert.equal(mock.streamCount(), 0);
  assert.equal(await within(keptStream.next(), 5000, 'the end of the stream at reset'), null);
});

test('ctx_notify_sends_on_the_call_s_own_stream_and_ping_is_answered', async (t) => {
  const tools = [
    {
      name: 'changer',
      description: 'Says the list changed during the call.',
      inputSchema: { type: 'object', properties: {} },
      run: (_args, ctx) => {
        const first = ctx.notify('notifications/tools/list_changed');
        const second = ctx.notify('notifications/message', { level: 'info', data: 'changed' });
        return { content: [{ type: 'text', text: `sent: ${first} ${second}` }] };
      },
    },
    {
      name: 'pinger',
      description: 'Pings the client.',
      inputSchema: { type: 'object', properties: {} },
      run: async (_args, ctx) => {
        const answer = await ctx.ask('ping', {});
        return { content: [{ type: 'text', text: `pong: ${JSON.stringify(answer.result)}` }] };
      },
    },
  ];
  const mock = await startMockMcp({ tools });
  t.after(() => mock.close());
  const s = await session(mock);
  const open = eventReader(await get(mock, { session: s.id }));
  assert.equal(await within(open.saw(': open\n\n'), 5000, 'the opening comment'), true);

  const stream = await messages(await post(mock, call(3, 'changer'), { session: s.id }));
  assert.deepEqual(stream, [
    { jsonrpc: '2.0', method: 'notifications/tools/list_changed' },
    { jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'changed' } },
    { jsonrpc: '2.0', id: 3, result: { content: [{ type: 'text', text: 'sent: true true' }] } },
  ]);
  assert.deepEqual(mock.sent().map((e) => [e.method, e.session, e.callId, e.stream, e.params]), [
    ['notifications/tools/list_changed', s.id, 3, undefined, undefined],
    ['notifications/message', s.id, 3, undefined, { level: 'info', data: 'changed' }],
  ]);
  // Nothing went on the GET stream: the next thing on it is the next notification.
  assert.equal(mock.notifyListChanged(), 1);
  assert.equal((await within(open.next(), 5000, 'list_changed')).method, 'notifications/tools/list_changed');
  assert.equal(open.raw(), `: open\n\n${LIST_CHANGED}`, 'nothing on the GET stream');

  // ping: the server asks on the call's stream, the client answers {}.
  const response = await post(mock, call(4, 'pinger'), { session: s.id });
  const pinging = eventReader(response);
  const ping = await within(pinging.next(), 5000, 'the ping');
  assert.equal(ping.method, 'ping');
  assert.deepEqual(ping.params, {});
  assert.equal((await post(mock, { jsonrpc: '2.0', id: ping.id, result: {} }, { session: s.id })).status, 202);
  assert.equal((await pinging.next()).result.content[0].text, 'pong: {}');
  assert.equal(mock.responses()[0].id, ping.id);
  assert.deepEqual(mock.responses()[0].result, {});

  // The client may ping the server too.
  const [pong] = await messages(await post(mock, { jsonrpc: '2.0', id: 5, method: 'ping' }, { session: s.id }));
  assert.deepEqual(pong, { jsonrpc: '2.0', id: 5, result: {} });

  // In a JSON answer nothing can go with the result.
  const json = await startMockMcp({ tools, answer: 'json' });
  t.after(() => json.close());
  const j = await session(json);
  const [answer] = await messages(await post(json, call(6, 'changer'), { session: j.id }));
  assert.equal(answer.result.content[0].text, 'sent: false false');
  assert.deepEqual(json.sent(), []);
});

test('add_faq_tool_publishes_a_read_only_tool_and_notifies_the_streams', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  const open = eventReader(await get(mock, { session: s.id }));
  const before = await listAll(mock, s);
  const faq = before.tools.find((tool) => tool.name === 'add_faq_tool');
  assert.equal(faq.title, 'Publish a FAQ tool');
  assert.equal(faq.annotations?.readOnlyHint, undefined, 'a write');
  assert.deepEqual(faq.inputSchema.required, ['topic']);
  assert.equal(faq.inputSchema.properties.topic.type, 'string');

  const [published] = await messages(await post(mock, call(7, 'add_faq_tool', { topic: 'Refunds & Returns at the Café, abroad' }), { session: s.id }));
  assert.equal(published.result.content[0].text, 'Published faq_refunds_returns_at_t.');
  assert.equal(published.result.isError, undefined);
  assert.deepEqual(await within(open.next(), 5000, 'list_changed'), { jsonrpc: '2.0', method: 'notifications/tools/list_changed' });
  assert.equal(mock.sent()[0].session, s.id);

  const after = await listAll(mock, s);
  assert.deepEqual(after.names, [...before.names, 'faq_refunds_returns_at_t']);
  const added = after.tools.at(-1);
  assert.equal(added.description, 'Answer questions about Refunds & Returns at the Café, abroad.');
  assert.equal(added.annotations.readOnlyHint, true);
  assert.equal(added.inputSchema.type, 'object');
  assert.equal(added.run, undefined);
  const [answer] = await messages(await post(mock, call(8, 'faq_refunds_returns_at_t', { question: 'How long?' }), { session: s.id }));
  assert.equal(answer.result.content[0].text, 'FAQ on Refunds & Returns at the Café, abroad: see the help centre.');

  // Again: no second tool of that name; a topic without a letter fails.
  const [again] = await messages(await post(mock, call(9, 'add_faq_tool', { topic: 'shipping' }), { session: s.id }));
  assert.equal(again.result.content[0].text, 'Published faq_shipping.');
  await messages(await post(mock, call(10, 'add_faq_tool', { topic: 'Shipping!' }), { session: s.id }));
  assert.deepEqual(mock.toolNames().filter((name) => name.startsWith('faq_')), ['faq_refunds_returns_at_t', 'faq_shipping']);
  const [bad] = await messages(await post(mock, call(11, 'add_faq_tool', { topic: '?!' }), { session: s.id }));
  assert.equal(bad.result.isError, true);
  assert.equal(mock.sent().length, 3, 'one notification per publication');

  // reset() brings back the demo tools without the published ones.
  mock.reset();
  assert.deepEqual(mock.toolNames(), before.names);
});

test('close_does_not_hang_with_a_stream_open', async () => {
  const mock = await startMockMcp();
  const s = await session(mock);
  const stream = eventReader(await get(mock, { session: s.id }));
  assert.equal(mock.streamCount(), 1);
  await within(mock.close(), 3000, 'close() with a GET stream open');
  // The client sees the stream end (or break).
  const end = await within(stream.next().catch(() => null), 3000, 'the stream to end');
  assert.equal(end, null);
  assert.equal(mock.streams()[0].closed, true);
  assert.equal(mock.streams()[0].closedBy, 'server');
});
