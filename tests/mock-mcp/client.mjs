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

/**
 * Reads an event stream as it arrives: `next()` → the next JSON-RPC message
 * (comment-only events such as `: open` skipped), or null once it ended;
 * `raw()` → every byte read so far, as text.
 */
export function eventReader(response) {
  assert.match(response.headers.get('content-type') ?? '', /^text\/event-stream/);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  let raw = '';
  const read = async () => {
    const { value, done } = await reader.read();
    if (done) return false;
    const chunk = decoder.decode(value, { stream: true });
    buffered += chunk;
    raw += chunk;
    return true;
  };
  return {
    raw: () => raw,
    /** Reads until `text` has been seen (false: the stream ended first). */
    async saw(text) {
      while (!raw.includes(text)) if (!(await read())) return false;
      return true;
    },
    async next() {
      for (;;) {
        const end = buffered.indexOf('\n\n');
        if (end >= 0) {
          const event = buffered.slice(0, end);
          buffered = buffered.slice(end + 2);
          const lines = event.split('\n').filter((line) => line);
          if (lines.every((line) => line.startsWith(':'))) continue;
          assert.match(event, /^event: message\n/);
          return JSON.parse(lines.find((line) => line.startsWith('data: ')).slice(6));
        }
        if (!(await read())) return null;
      }
    },
    cancel: () => reader.cancel(),
  };
}
