// Wire-format tests of the mock LLM server: the SSE it sends must look like
// the real OpenAI chat-completions stream, so the Rust parser is exercised on
// realistic input (split text, tool-call fragments, usage chunk, [DONE]).
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

function completionRequest(body, headers = {}) {
  return fetch(`${mock.url}/chat/completions`, {
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
