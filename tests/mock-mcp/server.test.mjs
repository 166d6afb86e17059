// Tests of the mock MCP server's wire format: what the engine's MCP client
// is tested against must itself behave like a Streamable HTTP server.
//
// Run:  node --test tests/mock-mcp/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startMockMcp } from './server.mjs';

const ACCEPT = 'application/json, text/event-stream';

async function post(mock, message, { session, version = '2025-06-18', accept = ACCEPT, signal } = {}) {
  const headers = { 'content-type': 'application/json', accept };
  if (session) headers['mcp-session-id'] = session;
  if (session && version) headers['mcp-protocol-version'] = version;
  return fetch(mock.url, { method: 'POST', headers, body: JSON.stringify(message), signal });
}

/** The JSON-RPC messages of an answer, JSON or event stream. */
async function messages(response) {
  const type = response.headers.get('content-type') ?? '';
  const body = await response.text();
  if (type.startsWith('application/json')) return [JSON.parse(body)];
  assert.match(type, /^text\/event-stream/);
  return body
    .split('\n\n')
    .filter((event) => event.trim())
    .map((event) => {
      assert.match(event, /^event: message\n/);
      return JSON.parse(event.split('\n').find((line) => line.startsWith('data: ')).slice(6));
    });
}

async function session(mock, version = '2025-06-18') {
  const response = await post(mock, { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: version, capabilities: {}, clientInfo: { name: 't', version: '1' } } });
  assert.equal(response.status, 200);
  const id = response.headers.get('mcp-session-id');
  const [answer] = await messages(response);
  const done = await post(mock, { jsonrpc: '2.0', method: 'notifications/initialized' }, { session: id, version: answer.result.protocolVersion });
  assert.equal(done.status, 202);
  return { id, version: answer.result.protocolVersion };
}

test('initialize_agrees_on_a_revision_and_later_messages_need_the_session_and_its_version', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  assert.equal((await session(mock, '2025-03-26')).version, '2025-03-26');
  const s = await session(mock, '1999-01-01');
  assert.equal(s.version, '2025-06-18', 'an unknown revision gets the server\'s latest');

  const list = { jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} };
  assert.equal((await post(mock, list)).status, 400, 'no session id');
  assert.equal((await post(mock, list, { session: 'nope' })).status, 404, 'an unknown session');
  assert.equal((await post(mock, list, { session: s.id, version: null })).status, 400, 'no MCP-Protocol-Version');
  assert.equal((await post(mock, list, { session: s.id, accept: 'application/json' })).status, 406);
  assert.equal((await post(mock, list, { session: s.id })).status, 200);

  mock.expireSessions();
  assert.equal((await post(mock, list, { session: s.id })).status, 404, 'a forgotten session');
});

test('tools_list_comes_in_pages_without_the_run_functions', async (t) => {
  const mock = await startMockMcp({ pageSize: 2 });
  t.after(() => mock.close());
  const s = await session(mock);
  const names = [];
  let cursor;
  let pages = 0;
  do {
    const [answer] = await messages(await post(mock, { jsonrpc: '2.0', id: 10 + pages, method: 'tools/list', params: cursor ? { cursor } : {} }, { session: s.id }));
    for (const tool of answer.result.tools) {
      assert.equal(tool.run, undefined);
      assert.equal(tool.inputSchema.type, 'object');
      names.push(tool.name);
    }
    cursor = answer.result.nextCursor;
    pages += 1;
  } while (cursor);
  assert.deepEqual(names, ['search', 'create_ticket', 'slow_report', 'broken', 'ask_model']);
  assert.equal(pages, 3);
});

test('a_call_streams_progress_then_its_result_and_a_json_server_answers_in_one_body', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  const call = { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'slow_report', arguments: { steps: 2 }, _meta: { progressToken: 'tok' } } };
  const stream = await messages(await post(mock, call, { session: s.id }));
  assert.deepEqual(stream.map((m) => m.method ?? 'result'), ['notifications/progress', 'notifications/progress', 'result']);
  assert.deepEqual(stream[1].params, { progressToken: 'tok', progress: 2, total: 2, message: 'Step 2 of 2' });
  assert.equal(stream[2].id, 7);
  assert.equal(stream[2].result.content[0].text, 'The report has 2 sections.');

  const json = await startMockMcp({ answer: 'json' });
  t.after(() => json.close());
  const j = await session(json);
  const [answer] = await messages(await post(json, { ...call, params: { name: 'create_ticket', arguments: { subject: 'Broken login' } } }, { session: j.id }));
  assert.equal(answer.result.content[0].text, 'Opened ticket T-1: Broken login');
  assert.deepEqual(json.tickets(), ['Broken login']);
});

test('a_cancelled_call_stops_and_a_server_request_waits_for_the_client_s_answer', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  const slow = post(mock, { jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'slow_report', arguments: { steps: 100 } } }, { session: s.id });
  await mock.waitFor((log) => log.some((e) => e.tool === 'slow_report'));
  const cancelled = await post(mock, { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 3, reason: 'given up' } }, { session: s.id });
  assert.equal(cancelled.status, 202);
  await mock.waitFor((log) => log.some((e) => e.tool === 'slow_report' && e.outcome === 'cancelled'));
  const [error] = (await messages(await slow)).filter((m) => m.id === 3);
  assert.equal(error.error.code, -32603);
  assert.equal(mock.cancellations()[0].params.requestId, 3);

  const asking = post(mock, { jsonrpc: '2.0', id: 4, method: 'tools/call', params: { name: 'ask_model', arguments: {} } }, { session: s.id });
  const response = await asking;
  const reader = response.body.getReader();
  const { value } = await reader.read();
  const request = JSON.parse(new TextDecoder().decode(value).split('data: ')[1]);
  assert.equal(request.method, 'sampling/createMessage');
  const refused = await post(mock, { jsonrpc: '2.0', id: request.id, error: { code: -32601, message: 'Method not found' } }, { session: s.id });
  assert.equal(refused.status, 202);
  let rest = '';
  for (;;) {
    const { value: more, done } = await reader.read();
    if (done) break;
    rest += new TextDecoder().decode(more);
  }
  assert.match(rest, /The client refused: -32601 Method not found/);
  assert.equal(mock.responses().length, 1);
});
