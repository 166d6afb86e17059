// What the mock MCP server's own tests send it: a POST of one message in a
// session, the messages of its answer, and a session set up. Not a test
// file itself (node --test runs *.test.mjs).

import assert from 'node:assert/strict';

export const ACCEPT = 'application/json, text/event-stream';

/** POSTs one JSON-RPC message (with the session's headers when given). */
export async function post(mock, message, { session, version = '2025-06-18', accept = ACCEPT, signal } = {}) {
  const headers = { 'content-type': 'application/json', accept };
  if (session) headers['mcp-session-id'] = session;
  if (session && version) headers['mcp-protocol-version'] = version;
  return fetch(mock.url, { method: 'POST', headers, body: JSON.stringify(message), signal });
}

/** The JSON-RPC messages of an answer, JSON or event stream (each event `event: message`). */
export async function messages(response) {
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

/** `initialize` then `notifications/initialized`: the session's id, revision and the server's capabilities. */
export async function session(mock, version = '2025-06-18', capabilities = {}) {
  const response = await post(mock, { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: version, capabilities, clientInfo: { name: 't', version: '1' } } });
  assert.equal(response.status, 200);
  const id = response.headers.get('mcp-session-id');
  const [answer] = await messages(response);
  const done = await post(mock, { jsonrpc: '2.0', method: 'notifications/initialized' }, { session: id, version: answer.result.protocolVersion });
  assert.equal(done.status, 202);
  return { id, version: answer.result.protocolVersion, capabilities: answer.result.capabilities };
}
