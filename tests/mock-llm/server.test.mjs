// Wire-format tests of the mock LLM server: the SSE it sends must look like
// the real OpenAI chat-completions and Anthropic Messages streams, so the Rust
// parsers are exercised on realistic input (split text, tool-call fragments,
// usage, [DONE], thinking signatures, errors, cut-off bodies).
// Run: node --test tests/mock-llm/

import { test, before, after, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import {
  startMockLlm,
  defaultPolicy,
  bestElementForTask,
  parseInteractiveElements,
  splitArguments,
  anthropicToOpenAi,
  callArguments,
  finishReason,
} from './server.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
let mock;

before(async () => {
  mock = await startMockLlm({ quiet: true });
});
after(async () => {
  await mock.close();
});
beforeEach(() => {
  mock.reset();
});

/** Reads a text/event-stream body into a list of `data:` payloads (strings). */
async function readSse(response) {
  const decoder = new TextDecoder();
  const events = [];
  let buffer = '';
  const flushEvents = () => {
    buffer = buffer.replace(/\r\n/g, '\n');
    let boundary;
    while ((boundary = buffer.indexOf('\n\n')) !== -1) {
      const block = buffer.slice(0, boundary);
      buffer = buffer.slice(boundary + 2);
      const data = block
        .split('\n')
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).replace(/^ /, ''))
        .join('\n');
      if (data) events.push(data);
    }
  };
  for await (const bytes of response.body) {
    buffer += decoder.decode(bytes, { stream: true });
    flushEvents();
  }
  buffer += decoder.decode();
  flushEvents();
  return { events, rest: buffer };
}

function completionRequest(body, headers = {}, init = {}) {
  return fetch(`${mock.url}/chat/completions`, {
    ...init,
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer sk-unit', ...headers },
    body: JSON.stringify({ model: 'mock-1', messages: [{ role: 'user', content: 'hi' }], ...body }),
  });
}

function parseChunks(events) {
  assert.equal(events.at(-1), '[DONE]', 'stream ends with [DONE]');
  assert.equal(events.filter((e) => e === '[DONE]').length, 1, 'exactly one [DONE]');
  return events.slice(0, -1).map((e) => JSON.parse(e));
}

function assertChunkShape(chunk) {
  assert.equal(typeof chunk.id, 'string');
  assert.equal(chunk.object, 'chat.completion.chunk');
  assert.equal(typeof chunk.created, 'number');
  assert.equal(chunk.model, 'mock-1');
  assert.ok(Array.isArray(chunk.choices));
}

test('text stream: split deltas, finish stop, usage chunk, [DONE], CORS', async () => {
  const text = 'Hello there, this is a streamed answer.';
  mock.setScript([{ text }]);
  const response = await completionRequest({ stream: true, stream_options: { include_usage: true } });
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type'), /^text\/event-stream/);
  assert.equal(response.headers.get('access-control-allow-origin'), '*');
  const { events, rest } = await readSse(response);
  assert.equal(rest, '', 'no partial event after [DONE]');
  const chunks = parseChunks(events);
  chunks.forEach(assertChunkShape);
  assert.ok(new Set(chunks.map((c) => c.id)).size === 1, 'one completion id for all chunks');

  const withChoices = chunks.filter((c) => c.choices.length > 0);
  assert.equal(withChoices[0].choices[0].delta.role, 'assistant');
  const contentDeltas = withChoices.map((c) => c.choices[0].delta.content).filter((c) => typeof c === 'string' && c !== '');
  assert.ok(contentDeltas.length >= 3, `text split into several deltas (got ${contentDeltas.length})`);
  assert.equal(contentDeltas.join(''), text);
  const finishes = withChoices.map((c) => c.choices[0].finish_reason);
  assert.deepEqual(finishes.filter((f) => f !== null), ['stop']);
  assert.equal(finishes.at(-1), 'stop');
  for (const c of withChoices) assert.equal(c.usage, null, 'usage: null on content chunks when include_usage');

  const usageChunk = chunks.at(-1);
  assert.deepEqual(usageChunk.choices, []);
  assert.ok(usageChunk.usage.prompt_tokens > 0);
  assert.ok(usageChunk.usage.completion_tokens > 0);
  assert.equal(usageChunk.usage.total_tokens, usageChunk.usage.prompt_tokens + usageChunk.usage.completion_tokens);
});

test('no usage chunk without stream_options.include_usage', async () => {
  mock.setScript([{ text: 'short answer here' }]);
  const { events } = await readSse(await completionRequest({ stream: true }));
  const chunks = parseChunks(events);
  assert.ok(chunks.every((c) => c.choices.length === 1));
  assert.ok(chunks.every((c) => !('usage' in c)));
});

test('parallel tool calls: first fragment id+name, later fragments arguments only', async () => {
  const calls = [
    { name: 'click', arguments: { ref: 'e12', note: 'a longer argument value to split' } },
    { name: 'read_page', arguments: {}, id: 'call_fixed' },
  ];
  mock.setScript([{ text: 'Working on it.', toolCalls: calls, usage: { prompt_tokens: 11, completion_tokens: 7 } }]);
  const { events } = await readSse(await completionRequest({ stream: true, stream_options: { include_usage: true } }));
  const chunks = parseChunks(events);
  chunks.forEach(assertChunkShape);
  const deltas = chunks.filter((c) => c.choices.length > 0).map((c) => c.choices[0].delta);
  assert.equal(deltas.map((d) => d.content ?? '').join(''), 'Working on it.');

  const byIndex = new Map();
  for (const delta of deltas) {
    for (const fragment of delta.tool_calls ?? []) {
      if (!byIndex.has(fragment.index)) byIndex.set(fragment.index, []);
      byIndex.get(fragment.index).push(fragment);
    }
  }
  assert.deepEqual([...byIndex.keys()], [0, 1]);
  for (const [index, fragments] of byIndex) {
    const [head, ...tail] = fragments;
    assert.equal(typeof head.id, 'string');
    assert.equal(head.type, 'function');
    assert.equal(head.function.name, calls[index].name);
    assert.ok(tail.length >= 2, `arguments of call ${index} arrive in several fragments`);
    for (const later of tail) {
      assert.deepEqual(Object.keys(later).sort(), ['function', 'index']);
      assert.deepEqual(Object.keys(later.function), ['arguments']);
    }
    const joined = fragments.map((f) => f.function.arguments ?? '').join('');
    assert.deepEqual(JSON.parse(joined), calls[index].arguments);
  }
  assert.equal(byIndex.get(1)[0].id, 'call_fixed');
  assert.notEqual(byIndex.get(0)[0].id, byIndex.get(1)[0].id);

  const finishes = chunks.filter((c) => c.choices.length > 0).map((c) => c.choices[0].finish_reason).filter((f) => f !== null);
  assert.deepEqual(finishes, ['tool_calls']);
  assert.deepEqual(chunks.at(-1).usage, { prompt_tokens: 11, completion_tokens: 7, total_tokens: 18 });
});

test('a call\'s extraContent rides on its first fragment as extra_content, as Gemini sends a thought signature', async () => {
  const signature = { google: { thought_signature: 'c2ln' } };
  mock.setScript([{ toolCalls: [{ name: 'read_page', arguments: {}, extraContent: signature }, { name: 'click', arguments: { ref: 'e1' } }] }]);
  const { events } = await readSse(await completionRequest({ stream: true }));
  const fragments = parseChunks(events)
    .filter((c) => c.choices.length > 0)
    .flatMap((c) => c.choices[0].delta.tool_calls ?? []);
  const firsts = fragments.filter((f) => f.id);
  assert.deepEqual(firsts.map((f) => f.extra_content), [signature, undefined]);
  assert.equal(fragments.filter((f) => 'extra_content' in f).length, 1, 'on the first fragment only');
});

test('reasoningDetails: each array goes verbatim in one chunk before the text, as OpenRouter streams blocks', async () => {
  const details = [
    [{ type: 'reasoning.text', text: 'Check ', signature: null, format: 'anthropic-claude-v1', index: 0 }],
    [{ type: 'reasoning.text', text: 'it.', index: 0 }, { type: 'reasoning.encrypted', data: 'QUJD', id: 'call_x', index: 0 }],
  ];
  mock.setScript([{ reasoningDetails: details, text: 'Done.', toolCalls: [{ name: 'click', arguments: { ref: 'e1' } }] }]);
  const { events } = await readSse(await completionRequest({ stream: true }));
  const deltas = parseChunks(events).filter((c) => c.choices.length > 0).map((c) => c.choices[0].delta);
  const sent = deltas.filter((d) => 'reasoning_details' in d);
  assert.deepEqual(sent.map((d) => d.reasoning_details), details);
  const first = deltas.indexOf(sent[0]);
  assert.ok(deltas.slice(0, first).every((d) => !d.content), 'before any text');
  assert.equal(deltas.map((d) => d.content ?? '').join(''), 'Done.');

  // The Anthropic format has no such field: the step streams without it.
  mock.setScript([{ reasoningDetails: details, text: 'Done.' }]);
  const { events: anthropicEvents } = await readSse(await messagesRequest({ stream: true }));
  assert.ok(anthropicEvents.every((e) => !e.includes('reasoning_details')));
  assert.ok(anthropicEvents.some((e) => e.includes('"text_delta"')));
});

test('finish override and empty tool-call ids are passed through as scripted', async () => {
  mock.setScript([{ toolCalls: [{ name: 'click', arguments: { ref: 'e1' }, id: '' }], finish: 'stop' }]);
  const { events } = await readSse(await completionRequest({ stream: true }));
  const chunks = parseChunks(events);
  const head = chunks.flatMap((c) => c.choices[0].delta.tool_calls ?? [])[0];
  assert.equal(head.id, '');
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
});

test('CORS preflight allows authorization and content-type from any origin', async () => {
  const response = await fetch(`${mock.url}/chat/completions`, {
    method: 'OPTIONS',
    headers: {
      origin: 'chrome-extension://abcdefghijklmnop',
      'access-control-request-method': 'POST',
      'access-control-request-headers': 'authorization,content-type',
    },
  });
  assert.equal(response.status, 204);
  assert.equal(response.headers.get('access-control-allow-origin'), '*');
  const allowed = response.headers.get('access-control-allow-headers').split(',').map((h) => h.trim());
  assert.ok(allowed.includes('authorization'));
  assert.ok(allowed.includes('content-type'));
  assert.match(response.headers.get('access-control-allow-methods'), /POST/);
  assert.equal(mock.requests().length, 0, 'preflight is not a provider request');
});

test('error step answers with HTTP status and OpenAI error JSON', async () => {
  mock.setScript([{ error: { status: 429 } }, { error: { status: 400, body: { error: { message: 'bad', type: 'invalid_request_error', param: null, code: 'x' } } } }]);
  const first = await completionRequest({ stream: true });
  assert.equal(first.status, 429);
  assert.equal(first.headers.get('access-control-allow-origin'), '*');
  const firstBody = await first.json();
  assert.equal(typeof firstBody.error.message, 'string');
  assert.equal(firstBody.error.type, 'rate_limit_exceeded');
  const second = await completionRequest({ stream: true });
  assert.equal(second.status, 400);
  assert.deepEqual(await second.json(), { error: { message: 'bad', type: 'invalid_request_error', param: null, code: 'x' } });
});

test('non-streaming request gets a chat.completion object', async () => {
  mock.setScript([{ toolCalls: [{ name: 'read_page', arguments: {} }], text: 'Reading.' }]);
  const response = await completionRequest({});
  const body = await response.json();
  assert.equal(body.object, 'chat.completion');
  assert.equal(body.choices[0].message.role, 'assistant');
  assert.equal(body.choices[0].message.content, 'Reading.');
  assert.equal(body.choices[0].message.tool_calls[0].function.name, 'read_page');
  assert.equal(body.choices[0].message.tool_calls[0].function.arguments, '{}');
  assert.equal(body.choices[0].finish_reason, 'tool_calls');
  assert.equal(body.usage.total_tokens, body.usage.prompt_tokens + body.usage.completion_tokens);
});

test('request log records headers (incl. authorization) and parsed body; reset clears it', async () => {
  mock.setScript([{ text: 'ok then' }]);
  await readSse(await completionRequest({ stream: true }, { authorization: 'Bearer sk-test-SECRET-123' }));
  const log = await (await fetch(`${mock.origin}/__control/requests`)).json();
  assert.equal(log.length, 1);
  assert.equal(log[0].headers.authorization, 'Bearer sk-test-SECRET-123');
  assert.equal(log[0].body.model, 'mock-1');
  assert.equal(log[0].body.stream, true);
  assert.equal(log[0].outcome, 'completed');
  assert.equal((await fetch(`${mock.origin}/__control/reset`, { method: 'POST' })).status, 200);
  assert.deepEqual(await (await fetch(`${mock.origin}/__control/requests`)).json(), []);
});

test('control API script endpoint replaces the queue', async () => {
  const set = await fetch(`${mock.origin}/__control/script`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ steps: [{ text: 'first one' }, { text: 'second one' }] }),
  });
  assert.deepEqual(await set.json(), { ok: true, pendingSteps: 2 });
  const texts = [];
  for (let i = 0; i < 2; i += 1) {
    const chunks = parseChunks((await readSse(await completionRequest({ stream: true }))).events);
    texts.push(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''));
  }
  assert.deepEqual(texts, ['first one', 'second one']);
  const state = await (await fetch(`${mock.origin}/__control/state`)).json();
  assert.deepEqual(state, { pendingSteps: 0, requestCount: 2, inFlight: 0 });
});

test('stall then continue: one delta, a pause, then the rest of the scripted step', async () => {
  mock.setScript([{ stallMs: 150, text: 'Thinking', then: { text: ' done now.' } }]);
  const chunks = parseChunks((await readSse(await completionRequest({ stream: true }))).events);
  assert.equal(chunks.map((c) => c.choices[0].delta.content ?? '').join(''), 'Thinking done now.');
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  assert.equal(mock.requests()[0].outcome, 'completed');
});

test('stall with ticks keeps sending small deltas while stalled', async () => {
  mock.setScript([{ stallMs: 400, tickMs: 50, tickText: '.', text: 'Hm', then: { text: ' ok' } }]);
  const chunks = parseChunks((await readSse(await completionRequest({ stream: true }))).events);
  const text = chunks.map((c) => c.choices[0].delta.content ?? '').join('');
  assert.match(text, /^Hm\.{2,} ok$/);
});

test('stall without continuation ends the body abruptly (no finish, no [DONE])', async () => {
  mock.setScript([{ stallMs: 50 }]);
  const response = await completionRequest({ stream: true });
  const seen = [];
  await assert.rejects(async () => {
    const decoder = new TextDecoder();
    for await (const bytes of response.body) seen.push(decoder.decode(bytes));
  });
  const text = seen.join('');
  assert.match(text, /"content":"Thinking"/);
  assert.doesNotMatch(text, /\[DONE\]/);
  assert.equal(mock.requests()[0].outcome, 'truncated');
});

test('client abort during a stall is recorded and frees the server', async () => {
  mock.setScript([{ stallMs: 600000 }]);
  const response = await completionRequest({ stream: true });
  // Read the first delta, then abort like a killed service worker would.
  const reader = response.body.getReader();
  const first = await reader.read();
  assert.match(new TextDecoder().decode(first.value), /Thinking/);
  await reader.cancel();
  const deadline = Date.now() + 10000;
  while (mock.requests()[0].outcome !== 'aborted' && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(mock.requests()[0].outcome, 'aborted');
});

test('parseInteractiveElements and bestElementForTask pick "Subscribe" for the newsletter task', () => {
  const page = [
    'Title: Acme Newsletter',
    'Interactive elements:',
    '[e1] link "Newsletter archive"',
    '[e2] button "Unsubscribe"',
    '[e3] button "Subscribe"',
    '[e4] button "Contact"',
  ].join('\n');
  const elements = parseInteractiveElements(page);
  assert.deepEqual(elements.map((e) => e.ref), ['e1', 'e2', 'e3', 'e4']);
  assert.equal(bestElementForTask(elements, 'Subscribe to the newsletter').ref, 'e3');
  assert.equal(bestElementForTask(elements, 'Subscribe to the newsletter on this page').ref, 'e3');
  assert.equal(bestElementForTask(elements, 'Please unsubscribe me').ref, 'e2');
  assert.equal(bestElementForTask(elements, 'click the Contact button').ref, 'e4');
  assert.equal(bestElementForTask(elements, 'Open the newsletters archive').ref, 'e1');
  assert.equal(bestElementForTask(elements, 'Buy a car'), null);
});

test('splitArguments always yields fragments that join back to the JSON', () => {
  for (const json of ['{}', '{"ref":"e1"}', JSON.stringify({ a: 'x'.repeat(100) })]) {
    const parts = splitArguments(json);
    assert.equal(parts.join(''), json);
    assert.ok(parts.length >= 2);
  }
});

test('default policy over HTTP: read_page, then click the best match, then a final answer', async () => {
  const tools = [
    { type: 'function', function: { name: 'read_page', parameters: { type: 'object', properties: {} } } },
    { type: 'function', function: { name: 'click', parameters: { type: 'object', properties: { ref: { type: 'string' } } } } },
  ];
  const messages = [
    { role: 'system', content: 'You are an agent.' },
    { role: 'user', content: 'Subscribe to the newsletter' },
  ];
  const assemble = (chunks) => {
    const calls = [];
    let text = '';
    for (const c of chunks) {
      const delta = c.choices[0]?.delta ?? {};
      text += delta.content ?? '';
      for (const f of delta.tool_calls ?? []) {
        calls[f.index] ??= { id: '', name: '', arguments: '' };
        if (f.id) calls[f.index].id = f.id;
        if (f.function?.name) calls[f.index].name = f.function.name;
        calls[f.index].arguments += f.function?.arguments ?? '';
      }
    }
    return { text, calls };
  };
  const turn = async () =>
    assemble(parseChunks((await readSse(await completionRequest({ stream: true, messages, tools }))).events));

  const first = await turn();
  assert.equal(first.calls.length, 1);
  assert.equal(first.calls[0].name, 'read_page');
  messages.push({
    role: 'assistant',
    content: first.text,
    tool_calls: first.calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })),
  });
  messages.push({
    role: 'tool',
    tool_call_id: first.calls[0].id,
    content: 'Acme Newsletter\nInteractive elements:\n[e5] button "Unsubscribe"\n[e6] button "Subscribe"\n[e7] link "Newsletter archive"',
  });

  const second = await turn();
  assert.equal(second.calls[0].name, 'click');
  assert.deepEqual(JSON.parse(second.calls[0].arguments), { ref: 'e6' });
  messages.push({
    role: 'assistant',
    content: second.text,
    tool_calls: second.calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })),
  });
  messages.push({ role: 'tool', tool_call_id: second.calls[0].id, content: 'Clicked button "Subscribe".' });

  const third = await turn();
  assert.equal(third.calls.length, 0);
  assert.equal(third.text, 'Done: clicked "Subscribe".');
  assert.ok(mock.requests().every((r) => r.source === 'policy'));
});

test('default policy: no matching element gives a text answer; no tools offered gives text', () => {
  const body = {
    tools: [{ type: 'function', function: { name: 'click' } }],
    messages: [
      { role: 'user', content: 'Buy a car' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'read_page', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'Interactive elements:\n[e1] button "Subscribe"' },
    ],
  };
  const step = defaultPolicy(body);
  assert.equal(step.toolCalls, undefined);
  assert.match(step.text, /could not find/);
  assert.equal(defaultPolicy({ messages: [{ role: 'user', content: 'x' }] }).toolCalls, undefined);
});

test('default policy: a failed click reads the page again once, then gives up with text', () => {
  const base = [
    { role: 'user', content: [{ type: 'text', text: 'Subscribe' }] },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'read_page', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'Interactive elements:\n[e1] button "Subscribe"' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c2', type: 'function', function: { name: 'click', arguments: '{"ref":"e1"}' } }] },
    { role: 'tool', tool_call_id: 'c2', content: 'Unknown ref e1: call read_page again.' },
  ];
  const tools = [{ type: 'function', function: { name: 'click' } }];
  assert.equal(defaultPolicy({ tools, messages: base }).toolCalls[0].name, 'read_page');
  const more = [
    ...base,
    { role: 'assistant', content: null, tool_calls: [{ id: 'c3', type: 'function', function: { name: 'read_page', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'c3', content: 'Interactive elements:\n[e9] button "Subscribe"' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c4', type: 'function', function: { name: 'click', arguments: '{"ref":"e9"}' } }] },
    { role: 'tool', tool_call_id: 'c4', content: 'Error: element not found' },
  ];
  const final = defaultPolicy({ tools, messages: more });
  assert.equal(final.toolCalls, undefined);
  assert.match(final.text, /could not click "Subscribe"/);
  const succeeded = [...base.slice(0, 4), { role: 'tool', tool_call_id: 'c2', content: 'Clicked button "Subscribe". Call read_page to see the new page.' }];
  assert.equal(defaultPolicy({ tools, messages: succeeded }).text, 'Done: clicked "Subscribe".');
});

test('an { auto: true } step uses the default policy for that request', async () => {
  mock.setScript([{ auto: true }, { text: 'scripted' }]);
  const tools = [{ type: 'function', function: { name: 'read_page' } }];
  const chunks = parseChunks((await readSse(await completionRequest({ stream: true, tools }))).events);
  assert.equal(chunks.flatMap((c) => c.choices[0].delta.tool_calls ?? [])[0].function.name, 'read_page');
  assert.equal(mock.requests()[0].source, 'policy');
  assert.equal(mock.pendingSteps(), 1);
});

test('setPolicy answers unscripted requests from the conversation until reset', async () => {
  mock.setPolicy((body) => ({ text: `seen ${body.messages.length} messages` }));
  const text = async () =>
    parseChunks((await readSse(await completionRequest({ stream: true }))).events)
      .map((c) => c.choices[0]?.delta?.content ?? '')
      .join('');
  assert.equal(await text(), 'seen 1 messages');
  mock.setScript([{ text: 'scripted first' }]);
  assert.equal(await text(), 'scripted first', 'a scripted step still goes first');
  mock.reset();
  assert.doesNotMatch(await text(), /^seen/, 'reset restores the default policy');
});

test('CLI: --port 0 prints MOCK_LLM_URL on the first stdout line and serves', async () => {
  const child = spawn(process.execPath, [path.join(here, 'server.mjs'), '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    const firstLine = await new Promise((resolve, reject) => {
      let out = '';
      child.stdout.on('data', (d) => {
        out += d;
        const newline = out.indexOf('\n');
        if (newline !== -1) resolve(out.slice(0, newline));
      });
      child.once('exit', (code) => reject(new Error(`server exited early with ${code}`)));
    });
    const match = /^MOCK_LLM_URL=(http:\/\/127\.0\.0\.1:(\d+)\/v1)$/.exec(firstLine);
    assert.ok(match, `first line was ${JSON.stringify(firstLine)}`);
    const models = await (await fetch(`${match[1]}/models`)).json();
    assert.equal(models.data[0].id, 'mock-1');
  } finally {
    child.kill('SIGTERM');
  }
});

// ---------------------------------------------------------------------------
// Anthropic Messages format and error injection.

/** Reads a text/event-stream body into `{ event, data }` records (event '' when absent). */
async function readSseEvents(response) {
  const text = await response.text();
  const records = [];
  const blocks = text.replace(/\r\n/g, '\n').split('\n\n');
  const rest = blocks.pop();
  for (const block of blocks) {
    let event = '';
    const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith('event:')) event = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
    if (data.length > 0) records.push({ event, data: data.join('\n') });
  }
  return { records, rest };
}

/** Reads a body that may end with a network error; returns the text received and whether it failed. */
async function readUntilEnd(response) {
  const decoder = new TextDecoder();
  let text = '';
  try {
    for await (const bytes of response.body) text += decoder.decode(bytes, { stream: true });
    return { text, failed: false };
  } catch {
    return { text, failed: true };
  }
}

const ANTHROPIC_HEADERS = {
  'content-type': 'application/json',
  'x-api-key': 'sk-ant-unit',
  'anthropic-version': '2023-06-01',
  'anthropic-dangerous-direct-browser-access': 'true',
};

function messagesRequest(body, headers = ANTHROPIC_HEADERS, init = {}) {
  return fetch(`${mock.url}/messages`, {
    ...init,
    method: 'POST',
    headers,
    body: JSON.stringify({
      model: 'claude-mock',
      max_tokens: 1024,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }],
      ...body,
    }),
  });
}

/** Parses Anthropic events, checking that every `event:` name matches its `data.type`. */
function parseAnthropic(records) {
  return records.map(({ event, data }) => {
    const value = JSON.parse(data);
    assert.equal(event, value.type, `event name ${event} matches data.type`);
    return value;
  });
}

/** Assembles a Messages stream like a client would: blocks by index, stop reason, usage. */
function assembleAnthropic(events) {
  const blocks = [];
  let stopReason = null;
  let usage = {};
  for (const e of events) {
    if (e.type === 'message_start') usage = { ...e.message.usage };
    if (e.type === 'content_block_start') blocks[e.index] = { ...e.content_block, json: '', deltas: [] };
    if (e.type === 'content_block_delta') {
      const block = blocks[e.index];
      block.deltas.push(e.delta.type);
      if (e.delta.type === 'text_delta') block.text += e.delta.text;
      if (e.delta.type === 'thinking_delta') block.thinking += e.delta.thinking;
      if (e.delta.type === 'signature_delta') block.signature += e.delta.signature;
      if (e.delta.type === 'input_json_delta') block.json += e.delta.partial_json;
    }
    if (e.type === 'content_block_stop') blocks[e.index].stopped = true;
    if (e.type === 'message_delta') {
      stopReason = e.delta.stop_reason;
      usage = { ...usage, ...e.usage };
    }
  }
  return { blocks, stopReason, usage };
}

test('anthropic text stream: documented event order, split text deltas, end_turn, usage, headers recorded', async () => {
  const text = 'Hello there, this is a streamed answer.';
  mock.setScript([{ text, usage: { input_tokens: 21, output_tokens: 9 } }]);
  const response = await messagesRequest({ stream: true });
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type'), /^text\/event-stream/);
  assert.equal(response.headers.get('access-control-allow-origin'), '*');
  assert.match(response.headers.get('request-id'), /^req_mock_/);
  const { records, rest } = await readSseEvents(response);
  assert.equal(rest, '');
  const events = parseAnthropic(records);
  const types = events.map((e) => e.type);
  assert.equal(types[0], 'message_start');
  assert.ok(types.includes('ping'));
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  const start = events[0].message;
  assert.equal(start.type, 'message');
  assert.equal(start.role, 'assistant');
  assert.equal(start.model, 'claude-mock');
  assert.deepEqual(start.content, []);
  assert.equal(start.stop_reason, null);
  assert.equal(start.usage.input_tokens, 21);
  const withoutPing = types.filter((t) => t !== 'ping');
  assert.deepEqual(withoutPing.slice(0, 2), ['message_start', 'content_block_start']);
  assert.equal(withoutPing.at(-3), 'content_block_stop');
  const deltas = events.filter((e) => e.type === 'content_block_delta');
  assert.ok(deltas.length >= 3, 'text split into several deltas');
  assert.ok(deltas.every((d) => d.index === 0 && d.delta.type === 'text_delta'));
  const { blocks, stopReason, usage } = assembleAnthropic(events);
  assert.equal(blocks.length, 1);
  assert.equal(blocks[0].type, 'text');
  assert.equal(blocks[0].text, text);
  assert.equal(stopReason, 'end_turn');
  assert.equal(usage.output_tokens, 9);
  assert.equal(events.at(-2).delta.stop_sequence, null);

  const [entry] = mock.requests();
  assert.equal(entry.format, 'anthropic');
  assert.equal(entry.path, '/v1/messages');
  assert.equal(entry.headers['x-api-key'], 'sk-ant-unit');
  assert.equal(entry.headers['anthropic-version'], '2023-06-01');
  assert.equal(entry.headers['anthropic-dangerous-direct-browser-access'], 'true');
  assert.equal(entry.outcome, 'completed');
});

test('anthropic thinking + text + parallel tool_use: signature_delta, input_json_delta fragments, tool_use stop', async () => {
  const calls = [
    { name: 'click', arguments: { ref: 'e12', note: 'a longer argument value to split' } },
    { name: 'read_page', arguments: {}, id: 'toolu_fixed' },
  ];
  mock.setScript([{ thinking: 'The user wants a click. I should click it.', signature: 'EqSIG/abc+==', text: 'Working on it.', toolCalls: calls }]);
  const events = parseAnthropic((await readSseEvents(await messagesRequest({ stream: true }))).records);
  const { blocks, stopReason } = assembleAnthropic(events);
  assert.deepEqual(blocks.map((b) => b.type), ['thinking', 'text', 'tool_use', 'tool_use']);
  assert.ok(blocks.every((b) => b.stopped), 'every block is stopped');
  const [thinking, text, first, second] = blocks;
  assert.equal(thinking.thinking, 'The user wants a click. I should click it.');
  assert.equal(thinking.signature, 'EqSIG/abc+==');
  assert.ok(thinking.deltas.filter((d) => d === 'thinking_delta').length >= 2);
  assert.equal(thinking.deltas.at(-1), 'signature_delta', 'the signature comes last in its block');
  assert.equal(text.text, 'Working on it.');
  assert.match(first.id, /^toolu_/);
  assert.equal(first.name, 'click');
  assert.deepEqual(first.input, {});
  assert.ok(first.deltas.length >= 3, 'arguments arrive in several input_json_delta fragments');
  assert.deepEqual(JSON.parse(first.json), calls[0].arguments);
  assert.equal(second.id, 'toolu_fixed');
  assert.deepEqual(JSON.parse(second.json), {});
  assert.equal(stopReason, 'tool_use');
  // Blocks never interleave: each stop comes before the next start.
  let open = null;
  for (const e of events) {
    if (e.type === 'content_block_start') {
      assert.equal(open, null);
      open = e.index;
    }
    if (e.type === 'content_block_stop') {
      assert.equal(e.index, open);
      open = null;
    }
  }
});

test('thinking in OpenAI format streams reasoning_content deltas before the text', async () => {
  mock.setScript([{ thinking: 'Let me think about it.', text: 'Answer.' }]);
  const chunks = parseChunks((await readSse(await completionRequest({ stream: true }))).events);
  const deltas = chunks.map((c) => c.choices[0].delta);
  assert.equal(deltas.map((d) => d.reasoning_content ?? '').join(''), 'Let me think about it.');
  assert.equal(deltas.map((d) => d.content ?? '').join(''), 'Answer.');
  const lastReasoning = deltas.findLastIndex((d) => d.reasoning_content);
  const firstText = deltas.findIndex((d) => d.content);
  assert.ok(lastReasoning < firstText);
});

test('anthropic finish names map both ways; a step may use either name', () => {
  assert.equal(finishReason('anthropic', {}, false), 'end_turn');
  assert.equal(finishReason('anthropic', {}, true), 'tool_use');
  assert.equal(finishReason('anthropic', { finish: 'length' }, false), 'max_tokens');
  assert.equal(finishReason('anthropic', { finish: 'content_filter' }, false), 'refusal');
  assert.equal(finishReason('anthropic', { finish: 'pause_turn' }, false), 'pause_turn');
  assert.equal(finishReason('openai', { finish: 'max_tokens' }, false), 'length');
  assert.equal(finishReason('openai', { finish: 'stop' }, true), 'stop');
});

test('CORS preflight allows the Anthropic headers even when not echoed', async () => {
  for (const requested of [null, 'x-api-key,anthropic-version,anthropic-dangerous-direct-browser-access,content-type']) {
    const headers = { origin: 'http://127.0.0.1:1', 'access-control-request-method': 'POST' };
    if (requested) headers['access-control-request-headers'] = requested;
    const response = await fetch(`${mock.url}/messages`, { method: 'OPTIONS', headers });
    assert.equal(response.status, 204);
    const allowed = response.headers.get('access-control-allow-headers').split(',').map((h) => h.trim());
    for (const name of ['x-api-key', 'anthropic-version', 'anthropic-dangerous-direct-browser-access', 'content-type', 'authorization']) {
      assert.ok(allowed.includes(name), `${name} allowed`);
    }
  }
  assert.equal(mock.requests().length, 0);
});

test('anthropic request validation: missing anthropic-version or max_tokens is a 400 that keeps the script', async () => {
  mock.setScript([{ text: 'kept' }]);
  const { 'anthropic-version': _, ...noVersion } = ANTHROPIC_HEADERS;
  const first = await messagesRequest({ stream: true }, noVersion);
  assert.equal(first.status, 400);
  const body = await first.json();
  assert.equal(body.type, 'error');
  assert.equal(body.error.type, 'invalid_request_error');
  assert.match(body.error.message, /anthropic-version/);
  const second = await messagesRequest({ stream: true, max_tokens: undefined });
  assert.equal(second.status, 400);
  assert.match((await second.json()).error.message, /max_tokens/);
  assert.deepEqual(mock.requests().map((r) => r.outcome), ['rejected', 'rejected']);
  assert.equal(mock.pendingSteps(), 1);
});

test('anthropicToOpenAi turns tool_use / tool_result blocks into tool_calls / tool messages', () => {
  const converted = anthropicToOpenAi({
    model: 'm',
    system: 'Be brief.',
    tools: [{ name: 'read_page', description: 'd', input_schema: { type: 'object' } }],
    messages: [
      { role: 'user', content: 'Subscribe' },
      { role: 'assistant', content: [{ type: 'thinking', thinking: 't', signature: 's' }, { type: 'tool_use', id: 'tu1', name: 'read_page', input: {} }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'tu1', content: 'page', is_error: true }, { type: 'text', text: 'steer' }] },
    ],
  });
  assert.deepEqual(converted.messages, [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Subscribe' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'tu1', type: 'function', function: { name: 'read_page', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'tu1', content: 'Error: page' },
    { role: 'user', content: 'steer' },
  ]);
  assert.deepEqual(converted.tools, [{ type: 'function', function: { name: 'read_page', description: 'd', parameters: { type: 'object' } } }]);
});

test('anthropic default policy over HTTP: read_page, then click the best match, then a final answer', async () => {
  const tools = [
    { name: 'read_page', description: 'Read the page', input_schema: { type: 'object', properties: {} } },
    { name: 'click', description: 'Click', input_schema: { type: 'object', properties: { ref: { type: 'string' } } } },
  ];
  const messages = [{ role: 'user', content: [{ type: 'text', text: 'Subscribe to the newsletter' }] }];
  const turn = async () => {
    const events = parseAnthropic((await readSseEvents(await messagesRequest({ stream: true, system: 'You are an agent.', messages, tools }))).records);
    const { blocks, stopReason } = assembleAnthropic(events);
    const content = blocks.map((b) => (b.type === 'tool_use' ? { type: 'tool_use', id: b.id, name: b.name, input: JSON.parse(b.json) } : { type: 'text', text: b.text }));
    messages.push({ role: 'assistant', content });
    return { content, stopReason };
  };
  const first = await turn();
  assert.equal(first.stopReason, 'tool_use');
  const read = first.content.find((b) => b.type === 'tool_use');
  assert.equal(read.name, 'read_page');
  messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: read.id, content: 'Acme\nInteractive elements:\n[e5] button "Unsubscribe"\n[e6] button "Subscribe"' }] });
  const second = await turn();
  const click = second.content.find((b) => b.type === 'tool_use');
  assert.equal(click.name, 'click');
  assert.deepEqual(click.input, { ref: 'e6' });
  messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: click.id, content: 'Clicked button "Subscribe".' }] });
  const third = await turn();
  assert.equal(third.stopReason, 'end_turn');
  assert.deepEqual(third.content, [{ type: 'text', text: 'Done: clicked "Subscribe".' }]);
  assert.ok(mock.requests().every((r) => r.source === 'policy' && r.format === 'anthropic'));
});

test('anthropic non-streaming request gets a Message object', async () => {
  mock.setScript([{ thinking: 'hm', text: 'Reading.', toolCalls: [{ name: 'read_page', arguments: {} }] }]);
  const body = await (await messagesRequest({})).json();
  assert.equal(body.type, 'message');
  assert.deepEqual(body.content.map((b) => b.type), ['thinking', 'text', 'tool_use']);
  assert.equal(typeof body.content[0].signature, 'string');
  assert.equal(body.stop_reason, 'tool_use');
  assert.ok(body.usage.input_tokens > 0);
});

test('error steps in both formats: status, format-specific body, Retry-After headers exposed to CORS', async () => {
  mock.setScript([
    { error: { status: 429, headers: { 'retry-after': '1' } } },
    { error: { status: 429, headers: { 'retry-after-ms': '250' } } },
    { error: { status: 500 } },
    { error: { status: 401, body: 'invalid x-api-key' } },
  ]);
  const first = await completionRequest({ stream: true });
  assert.equal(first.status, 429);
  assert.equal(first.headers.get('retry-after'), '1');
  assert.match(first.headers.get('access-control-expose-headers'), /retry-after/);
  assert.equal((await first.json()).error.type, 'rate_limit_exceeded');

  const second = await messagesRequest({ stream: true });
  assert.equal(second.status, 429);
  assert.equal(second.headers.get('retry-after-ms'), '250');
  assert.match(second.headers.get('access-control-expose-headers'), /retry-after-ms/);
  assert.deepEqual(await second.json(), { type: 'error', error: { type: 'rate_limit_error', message: 'Mock error 429' } });

  const third = await messagesRequest({ stream: true });
  assert.equal(third.status, 500);
  assert.equal((await third.json()).error.type, 'api_error');

  const fourth = await messagesRequest({ stream: true });
  assert.equal(fourth.status, 401);
  assert.deepEqual(await fourth.json(), { type: 'error', error: { type: 'authentication_error', message: 'invalid x-api-key' } });
  assert.deepEqual(mock.requests().map((r) => r.outcome), ['error', 'error', 'error', 'error']);
});

test('mid-stream error: OpenAI error chunk, Anthropic overloaded_error event, after the streamed text', async () => {
  mock.setScript([{ text: 'Partial answer', midStreamError: true }, { text: 'Partial answer', midStreamError: true }]);
  const { events } = await readSse(await completionRequest({ stream: true }));
  assert.ok(!events.includes('[DONE]'));
  const last = JSON.parse(events.at(-1));
  assert.equal(typeof last.error.message, 'string');
  assert.equal(last.error.type, 'server_error');
  const text = events.slice(0, -1).map((e) => JSON.parse(e).choices[0].delta.content ?? '').join('');
  assert.equal(text, 'Partial answer');
  assert.ok(events.slice(0, -1).every((e) => JSON.parse(e).choices[0].finish_reason === null), 'no finish before the error');

  const anthropic = parseAnthropic((await readSseEvents(await messagesRequest({ stream: true }))).records);
  assert.deepEqual(anthropic.at(-1), { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } });
  assert.ok(!anthropic.some((e) => e.type === 'message_stop' || e.type === 'message_delta'));
  assert.equal(assembleAnthropic(anthropic).blocks[0].text, 'Partial answer');
  assert.deepEqual(mock.requests().map((r) => r.outcome), ['error', 'error']);
});

test('truncate: the body is cut inside a JSON chunk; true drops the connection, "end" ends the body', async () => {
  for (const format of ['openai', 'anthropic']) {
    mock.reset();
    mock.setScript([{ text: 'Some text first', truncate: true }, { text: 'Some text first', truncate: 'end' }]);
    const request = () => (format === 'openai' ? completionRequest({ stream: true }) : messagesRequest({ stream: true }));
    const dropped = await readUntilEnd(await request());
    assert.equal(dropped.failed, true, `${format}: the connection drop is a network error`);
    const ended = await readUntilEnd(await request());
    assert.equal(ended.failed, false, `${format}: 'end' completes the body`);
    for (const { text } of [dropped, ended]) {
      assert.match(text, /Some /);
      assert.ok(!text.endsWith('\n'), 'the body ends inside a frame');
      const lastData = text.slice(text.lastIndexOf('data: ') + 6);
      assert.ok(lastData.startsWith('{'));
      assert.throws(() => JSON.parse(lastData), SyntaxError, 'the last chunk is cut inside its JSON');
      assert.doesNotMatch(text, /\[DONE\]|message_stop/);
    }
    assert.deepEqual(mock.requests().map((r) => r.outcome), ['truncated', 'truncated']);
  }
});

test('stallAt headers sends headers and no body byte; stallAt request sends nothing; aborts are recorded', async () => {
  mock.setScript([{ stallMs: 600000, stallAt: 'headers' }, { stallMs: 600000, stallAt: 'request' }]);
  const waitForOutcome = async (index, outcome) => {
    const until = Date.now() + 10000;
    while (mock.requests()[index]?.outcome !== outcome && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    assert.equal(mock.requests()[index]?.outcome, outcome);
  };

  const response = await completionRequest({ stream: true });
  assert.equal(response.status, 200, 'headers arrived');
  const reader = response.body.getReader();
  const first = await Promise.race([reader.read().then(() => 'byte'), new Promise((r) => setTimeout(() => r('silence'), 300))]);
  assert.equal(first, 'silence');
  await reader.cancel();
  await waitForOutcome(0, 'aborted');

  const controller = new AbortController();
  let settled = false;
  const pending = fetch(`${mock.url}/messages`, {
    method: 'POST',
    headers: ANTHROPIC_HEADERS,
    body: JSON.stringify({ model: 'claude-mock', max_tokens: 16, stream: true, messages: [{ role: 'user', content: 'hi' }] }),
    signal: controller.signal,
  }).finally(() => {
    settled = true;
  });
  await waitForOutcome(1, 'stalled');
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(settled, false, 'no response headers while stalled before the response');
  controller.abort();
  await assert.rejects(pending, { name: 'AbortError' });
  await waitForOutcome(1, 'aborted');
  assert.equal(mock.requests()[1].format, 'anthropic');
});

test('invalidArguments streams tool-call arguments that are not valid JSON, in both formats', async () => {
  assert.equal(callArguments({ arguments: { ref: 'e1' }, invalidArguments: true }), '{"ref":"e1",}');
  assert.throws(() => JSON.parse(callArguments({ arguments: {}, invalidArguments: true })));
  mock.setScript([
    { toolCalls: [{ name: 'click', arguments: { ref: 'e1' }, invalidArguments: true }] },
    { toolCalls: [{ name: 'click', arguments: { ref: 'e1' }, invalidArguments: true }] },
  ]);
  const chunks = parseChunks((await readSse(await completionRequest({ stream: true }))).events);
  const openAiArgs = chunks.flatMap((c) => c.choices[0].delta.tool_calls ?? []).map((f) => f.function.arguments ?? '').join('');
  assert.equal(openAiArgs, '{"ref":"e1",}');
  const { blocks } = assembleAnthropic(parseAnthropic((await readSseEvents(await messagesRequest({ stream: true }))).records));
  assert.equal(blocks[0].json, '{"ref":"e1",}');
});

test('error with stallMs sends the headers first and the body later; keepOpenMs holds a stream open after an error', async () => {
  mock.setScript([
    { error: { status: 503, stallMs: 200 } },
    { text: 'x', midStreamError: { keepOpenMs: 600000 } },
  ]);
  const started = Date.now();
  const response = await completionRequest({ stream: true });
  assert.equal(response.status, 503);
  assert.ok(Date.now() - started < 150, 'headers arrive before the stall ends');
  assert.equal((await response.json()).error.type, 'server_error');
  assert.ok(Date.now() - started >= 190, 'the body arrives after the stall');
  assert.equal(mock.requests()[0].outcome, 'error');

  const open = await completionRequest({ stream: true });
  const reader = open.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes('"error"')) text += decoder.decode((await reader.read()).value);
  await reader.cancel();
  const until = Date.now() + 10000;
  while (mock.requests()[1].outcome !== 'aborted' && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
  assert.equal(mock.requests()[1].outcome, 'aborted', 'the client had to close the stream');
});

test('json step: one JSON document with its status to a streaming request, in either format', async () => {
  const error = { error: { message: 'Incorrect API key provided', type: 'invalid_request_error', code: 'invalid_api_key' } };
  mock.setScript([
    { json: error },
    { json: { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } }, status: 200, headers: { 'x-request-id': 'r1' } },
  ]);
  const first = await completionRequest({ stream: true });
  assert.equal(first.status, 200);
  assert.equal(first.headers.get('content-type'), 'application/json');
  assert.deepEqual(await first.json(), error);
  const second = await messagesRequest({ stream: true });
  assert.equal(second.status, 200);
  assert.equal(second.headers.get('x-request-id'), 'r1');
  assert.equal((await second.json()).error.type, 'overloaded_error');
  assert.deepEqual(mock.requests().map((r) => r.outcome), ['completed', 'completed']);
});

test('redirect step: the status and Location, no body, and nothing else answered', async () => {
  mock.setScript([
    { redirect: { location: 'http://127.0.0.1:9/v1/chat/completions' } },
    { redirect: { location: 'http://127.0.0.1:9/v1/messages', status: 308 } },
  ]);
  const first = await completionRequest({ stream: true }, {}, { redirect: 'manual' });
  assert.equal(first.status, 307);
  assert.equal(first.headers.get('location'), 'http://127.0.0.1:9/v1/chat/completions');
  assert.equal(await first.text(), '');
  const second = await messagesRequest({ stream: true }, ANTHROPIC_HEADERS, { redirect: 'manual' });
  assert.equal(second.status, 308);
  assert.equal(second.headers.get('location'), 'http://127.0.0.1:9/v1/messages');
  assert.deepEqual(mock.requests().map((r) => r.outcome), ['redirected', 'redirected']);
});

test('error bodyBytes: the error JSON padded to that size; a client that stops reading is recorded as aborted', async () => {
  mock.setScript([
    { error: { status: 500, bodyBytes: 300000 } },
    { error: { status: 500, bodyBytes: 64 * 1024 * 1024 } },
  ]);
  const whole = await completionRequest({ stream: true });
  assert.equal(whole.status, 500);
  const text = await whole.text();
  assert.equal(Buffer.byteLength(text), 300000);
  assert.equal(JSON.parse(text).error.type, 'server_error', 'still the same JSON');
  assert.equal(mock.requests()[0].outcome, 'error');

  const controller = new AbortController();
  const endless = await completionRequest({ stream: true }, {}, { signal: controller.signal });
  const reader = endless.body.getReader();
  let read = 0;
  while (read < 64 * 1024) read += (await reader.read()).value.length;
  controller.abort();
  const until = Date.now() + 10000;
  while (mock.requests()[1].outcome !== 'aborted' && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
  assert.equal(mock.requests()[1].outcome, 'aborted', 'the server stopped writing when the client closed');
});
