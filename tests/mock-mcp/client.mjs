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
 * GETs the endpoint with the session's headers and `Last-Event-ID` (a
 * resumption), or none (a plain GET stream).
 */
export async function resume(mock, lastEventId, { session, version = '2025-06-18', accept = 'text/event-stream', signal } = {}) {
  const headers = {};
  if (accept) headers.accept = accept;
  if (session) headers['mcp-session-id'] = session;
  if (session && version) headers['mcp-protocol-version'] = version;
  if (lastEventId !== undefined) headers['last-event-id'] = lastEventId;
  return fetch(mock.url, { method: 'GET', headers, signal });
}

/** One event's fields: { event, id, retry, data } (null when it has none; data the raw text). */
function eventFields(event) {
  const fields = { event: null, id: null, retry: null, data: null };
  for (const line of event.split('\n')) {
    const colon = line.indexOf(':');
    if (colon <= 0) continue; // a comment, or no field
    const name = line.slice(0, colon);
    if (name in fields) fields[name] = line.slice(colon + 1).replace(/^ /, '');
  }
  return fields;
}

/**
 * Reads an event stream as it arrives: `next()` → the next JSON-RPC message
 * (comment-only events such as `: open` skipped), or null once it ended;
 * `nextEvent()` → that message with its event's fields, { message, id,
 * retry } (id and retry null when the event had none), or null;
 * `lastEventId()` → the last id seen (null: none yet); `raw()` → every
 * byte read so far, as text. A stream cut by the server rejects the read
 * that meets the cut.
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
  let lastEventId = null;
  const nextEvent = async () => {
    for (;;) {
      const end = buffered.indexOf('\n\n');
      if (end >= 0) {
        const event = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        const lines = event.split('\n').filter((line) => line);
        if (lines.every((line) => line.startsWith(':'))) continue;
        assert.match(event, /^event: message\n/);
        const { id, retry, data } = eventFields(event);
        if (id !== null) lastEventId = id;
        return { message: JSON.parse(data), id, retry: retry === null ? null : Number(retry) };
      }
      if (!(await read())) return null;
    }
  };
  return {
    raw: () => raw,
    lastEventId: () => lastEventId,
    nextEvent,
    /** Reads until `text` has been seen (false: the stream ended first). */
    async saw(text) {
      while (!raw.includes(text)) if (!(await read())) return false;
      return true;
    },
    async next() {
      return (await nextEvent())?.message ?? null;
    },
    cancel: () => reader.cancel(),
  };
}
