// Mock LLM server for the demo and the tests: OpenAI chat completions and
// Anthropic Messages, streaming, on 127.0.0.1.
//
// Owns: the OpenAI streaming wire format (SSE `chat.completion.chunk`s, split
// text deltas, tool-call deltas split into fragments, finish_reason, the usage
// chunk, `[DONE]`) at `POST …/chat/completions`; Anthropic's Messages
// streaming format (`message_start`, `ping`, `content_block_start/delta/stop`
// with `text_delta`, `input_json_delta` fragments, `thinking_delta` +
// `signature_delta`, `message_delta` with stop_reason and usage,
// `message_stop`, mid-stream `error` events) at `POST …/messages`; error
// injection; a scriptable queue of responses shared by both formats; a
// deterministic default policy (a "tiny agent" that reads the page, clicks the
// best-matching element and reports); and a log of every provider request for
// assertions.
// Must not: listen on anything but 127.0.0.1, depend on any package, or reach
// the network.
//
// CLI:  node tests/mock-llm/server.mjs [--port N] [--script steps.json]
//       prints `MOCK_LLM_URL=http://127.0.0.1:<port>/v1` as its first stdout
//       line and serves until killed.
// In-process: `startMockLlm({ port })` → { url, origin, close, setScript,
//       setPolicy, requests, reset, waitForRequests }. `setPolicy(fn)`
//       replaces the default policy with `fn(openAiBody) → Step` (null
//       restores it): a policy that reads only the conversation answers a
//       request repeated after a worker restart the same way.
//
// Control API (same port):
//   POST /__control/script   { steps: Step[], chunkDelayMs? }  replace the queue
//   GET  /__control/requests  every provider request received so far, each with
//                             { index, format: openai|anthropic, path, headers,
//                             body, source: script|policy|validation, step,
//                             outcome: pending|stalled|completed|error|
//                             truncated|aborted|rejected|redirected }
//   GET  /__control/state     { pendingSteps, requestCount, inFlight }
//   POST /__control/reset     empty queue and request log
//
// Step forms (each provider request consumes one, in either format; empty
// queue = default policy):
//   { text, thinking?, signature?, chunkDelayMs?, finish? }
//                                             finish: stop (default) | length | content_filter,
//                                             or the Anthropic names (end_turn, max_tokens,
//                                             refusal, …); each format gets its own name.
//                                             `thinking` streams reasoning first: Anthropic
//                                             thinking_delta + one signature_delta
//                                             (`signature`, default derived from the text);
//                                             OpenAI `reasoning_content` deltas.
//                                             `reasoningDetails` (OpenAI streams only): a list of
//                                             `delta.reasoning_details` arrays, each sent verbatim
//                                             in one chunk after the thinking, as OpenRouter
//                                             streams its reasoning blocks in fragments.
//   { toolCalls: [{ name, arguments, id?, invalidArguments?, extraContent? }], text?, thinking?, finish? }
//                                             finish defaults to tool_calls / tool_use;
//                                             invalidArguments: the streamed arguments are
//                                             not valid JSON (a trailing comma); extraContent:
//                                             the call's `extra_content` (OpenAI format)
//   { error: { status, body?, headers?, stallMs? } }
//                                             HTTP error with the format's error JSON body
//                                             (a string body becomes the message); headers
//                                             e.g. { 'retry-after': '1' } or
//                                             { 'retry-after-ms': '250' } (CORS-exposed);
//                                             stallMs: send the headers and the body's first
//                                             byte, the rest only after stallMs;
//                                             bodyBytes: the body padded with trailing blanks
//                                             (still the same JSON) to that many bytes, written
//                                             as fast as the client takes it (outcome `aborted`
//                                             when the client closes before its end)
//   { json, status?, headers? }               one JSON document `json` (sent as is) with
//                                             `status` (default 200) and Content-Type
//                                             application/json, whatever `stream` says: a
//                                             gateway's `200 {"error":{…}}`, a server that
//                                             ignores `stream: true` (outcome `completed`)
//   { redirect: { location, status? } }       a redirect (status default 307, e.g. 308, 302)
//                                             to `location`, no body (outcome `redirected`)
//   { midStreamError: true | { message?, type?, code?, keepOpenMs? }, text? }
//                                             stream `text`, then an error in the stream
//                                             (OpenAI: a `data: {"error":{…}}` chunk;
//                                             Anthropic: `event: error`, default
//                                             overloaded_error), then end the body (after
//                                             keepOpenMs, or when the client closes it:
//                                             outcome `aborted`)
//   { truncate: true | 'end', text?, toolCalls? }
//                                             stream the step, then half of one more JSON
//                                             chunk instead of the finish; `true` then
//                                             destroys the connection (the body never
//                                             completes), 'end' ends the body cleanly there
//   { stallMs, stallAt?, text?, tickMs?, tickText?, then? }
//                                             stallAt: 'delta' (default: headers + one text
//                                             delta `text`, default "Thinking"), 'headers'
//                                             (headers, then no byte of body) or 'request'
//                                             (not even headers); wait stallMs (sending
//                                             `tickText`, default ".", every tickMs if
//                                             given), then continue with step `then` or,
//                                             without it, end the body abruptly (no finish,
//                                             no [DONE])
//   { auto: true, chunkDelayMs? }             the default policy for this request
// Any step may carry `usage: { prompt_tokens, completion_tokens }` (or
// `input_tokens`, `output_tokens`) to override the computed usage.
// Messages requests without an `anthropic-version` header, `messages` or an
// integer `max_tokens` get the real API's 400 without consuming a step.

import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { readFileSync } from 'node:fs';

const HOST = '127.0.0.1';
const MODEL_FALLBACK = 'mock-1';

/** Words that never identify an element on their own. */
const STOP_WORDS = new Set([
  'a', 'an', 'the', 'to', 'on', 'in', 'of', 'for', 'and', 'or', 'at', 'this', 'that',
  'these', 'it', 'its', 'me', 'my', 'please', 'page', 'button', 'link', 'click', 'press',
  'tap', 'find', 'then', 'with', 'from', 'by', 'is', 'be', 'i', 'you', 'your', 'our', 'we',
]);

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function words(text) {
  return String(text)
    .toLowerCase()
    .split(/[^\p{L}\p{N}]+/u)
    .filter((w) => w.length > 0 && !STOP_WORDS.has(w))
    .map((w) => (w.length > 3 && w.endsWith('s') && !w.endsWith('ss') ? w.slice(0, -1) : w));
}

/** Text of a message `content`, which may be a string, null or an array of parts. */
export function contentText(content) {
  if (content == null) return '';
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content
      .map((part) => (typeof part === 'string' ? part : part && typeof part.text === 'string' ? part.text : ''))
      .join('');
  }
  return String(content);
}

/** Parses `[eN] role "name"` lines of a read_page result, in document order. */
export function parseInteractiveElements(text) {
  const elements = [];
  const pattern = /\[([A-Za-z0-9_-]+)\]\s+([A-Za-z][\w-]*)\s+"([^"\n]*)"/g;
  for (const match of String(text).matchAll(pattern)) {
    elements.push({ ref: match[1], role: match[2], name: match[3] });
  }
  return elements;
}

/**
 * Picks the element whose name best matches the task: most task words in the
 * name, then the largest share of the name covered by task words, then the
 * first in document order. Returns null when no name shares a word with the task.
 */
export function bestElementForTask(elements, task) {
  const taskWords = new Set(words(task));
  let best = null;
  for (const element of elements) {
    const nameWords = words(element.name);
    if (nameWords.length === 0) continue;
    const hits = nameWords.filter((w) => taskWords.has(w)).length;
    if (hits === 0) continue;
    const coverage = hits / nameWords.length;
    if (!best || hits > best.hits || (hits === best.hits && coverage > best.coverage)) {
      best = { element, hits, coverage };
    }
  }
  return best ? best.element : null;
}

/**
 * The default policy: a deterministic tiny agent.
 * Returns a Step ({ text } or { toolCalls }).
 */
export function defaultPolicy(body) {
  const messages = Array.isArray(body?.messages) ? body.messages : [];
  const toolsOffered = Array.isArray(body?.tools) && body.tools.length > 0;

  let lastUserIndex = -1;
  for (let i = messages.length - 1; i >= 0; i -= 1) {
    if (messages[i]?.role === 'user') {
      lastUserIndex = i;
      break;
    }
  }
  const task = lastUserIndex >= 0 ? contentText(messages[lastUserIndex].content) : '';

  // tool_call_id -> { name, arguments } over the whole conversation.
  const calls = new Map();
  for (const message of messages) {
    if (message?.role === 'assistant' && Array.isArray(message.tool_calls)) {
      for (const call of message.tool_calls) {
        let args = {};
        try {
          args = JSON.parse(call?.function?.arguments || '{}');
        } catch {
          args = {};
        }
        calls.set(call?.id, { name: call?.function?.name, arguments: args });
      }
    }
  }
  const toolNameOf = (message) => {
    const known = calls.get(message.tool_call_id);
    if (known?.name) return known.name;
    if (/Interactive elements:/i.test(contentText(message.content))) return 'read_page';
    return message.name || 'unknown';
  };

  const sinceUser = messages.slice(lastUserIndex + 1);
  const toolMessages = sinceUser.filter((m) => m?.role === 'tool');

  if (!toolsOffered) {
    return { text: `I cannot use tools right now, so I stop here. Task was: "${task}".` };
  }
  if (toolMessages.length === 0) {
    return { text: 'Let me read the page first.', toolCalls: [{ name: 'read_page', arguments: {} }] };
  }
  if (toolMessages.length > 8) {
    return { text: 'I tried several times without success, so I stop here.' };
  }

  const lastTool = toolMessages[toolMessages.length - 1];
  const lastToolName = toolNameOf(lastTool);
  const lastContent = contentText(lastTool.content);

  if (lastToolName === 'read_page') {
    const elements = parseInteractiveElements(lastContent);
    const target = bestElementForTask(elements, task);
    if (!target) {
      const names = elements.map((e) => `"${e.name}"`).join(', ') || 'none';
      return {
        text: `I could not find an element on the page that matches "${task}". Interactive elements: ${names}.`,
      };
    }
    return {
      text: `I will click "${target.name}".`,
      toolCalls: [{ name: 'click', arguments: { ref: target.ref } }],
    };
  }

  if (lastToolName === 'click') {
    const callInfo = calls.get(lastTool.tool_call_id);
    const ref = callInfo?.arguments?.ref;
    let name = callInfo?.arguments?.text;
    if (!name && ref) {
      // The name the ref had in the latest read_page result before the click.
      for (const message of toolMessages) {
        if (toolNameOf(message) !== 'read_page') continue;
        const found = parseInteractiveElements(contentText(message.content)).find((e) => e.ref === ref);
        if (found) name = found.name;
      }
    }
    // A failed click says so (the content script's ok:false message); a successful
    // one may still mention read_page, so that word alone is not a failure.
    const failed = /^\s*(error|failed)\b|\b(stale|not found|unknown ref|no element|no visible|not visible|no longer|disabled|could not|cannot|failed)\b/i.test(lastContent);
    const clickAttempts = toolMessages.filter((m) => toolNameOf(m) === 'click').length;
    if (failed && clickAttempts < 2) {
      return { text: 'The click did not work; reading the page again.', toolCalls: [{ name: 'read_page', arguments: {} }] };
    }
    if (failed) {
      return { text: `I could not click "${name ?? ref ?? 'the element'}": ${lastContent}` };
    }
    return { text: `Done: clicked "${name ?? ref ?? 'the element'}".` };
  }

  return { text: `Done. The last tool (${lastToolName}) returned: ${lastContent.slice(0, 200)}` };
}

/** Splits text into several deltas (word-sized, at least two when possible). */
export function splitText(text) {
  const pieces = String(text).match(/\S+\s*|\s+/g) || [];
  if (pieces.length === 1 && text.length > 1) {
    const middle = Math.ceil(text.length / 2);
    return [text.slice(0, middle), text.slice(middle)];
  }
  return pieces;
}

/** Splits a JSON argument string into at least three fragments where it has the length. */
export function splitArguments(json) {
  if (json.length <= 1) return [json];
  const count = Math.min(json.length, Math.max(3, Math.ceil(json.length / 6)));
  const size = Math.ceil(json.length / count);
  const fragments = [];
  for (let i = 0; i < json.length; i += size) fragments.push(json.slice(i, i + size));
  return fragments;
}

function estimateTokens(text) {
  return Math.max(1, Math.ceil(String(text).length / 4));
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

/** Request headers browsers may send (OpenAI and Anthropic clients). */
const ALLOWED_HEADERS = [
  'authorization',
  'content-type',
  'x-api-key',
  'anthropic-version',
  'anthropic-dangerous-direct-browser-access',
  'anthropic-beta',
];
/** Response headers a cross-origin caller may read (Retry-After is not CORS-safelisted). */
const EXPOSED_HEADERS = ['retry-after', 'retry-after-ms', 'request-id', 'x-request-id'];

function corsHeaders(req, extraExposed = []) {
  const requested = req.headers['access-control-request-headers'];
  const allowHeaders = [...ALLOWED_HEADERS];
  if (requested) {
    for (const h of String(requested).split(',')) {
      const name = h.trim().toLowerCase();
      if (name && !allowHeaders.includes(name)) allowHeaders.push(name);
    }
  }
  const exposeHeaders = [...EXPOSED_HEADERS];
  for (const h of extraExposed) {
    const name = String(h).trim().toLowerCase();
    if (name && !exposeHeaders.includes(name)) exposeHeaders.push(name);
  }
  const headers = {
    'Access-Control-Allow-Origin': '*',
    'Access-Control-Allow-Methods': 'GET, POST, OPTIONS',
    'Access-Control-Allow-Headers': allowHeaders.join(', '),
    'Access-Control-Expose-Headers': exposeHeaders.join(', '),
    'Access-Control-Max-Age': '600',
  };
  if (req.headers['access-control-request-private-network']) {
    headers['Access-Control-Allow-Private-Network'] = 'true';
  }
  return headers;
}

function sendJson(req, res, status, value, extraHeaders = {}) {
  const body = JSON.stringify(value);
  res.writeHead(status, {
    ...corsHeaders(req, Object.keys(extraHeaders)),
    'Content-Type': 'application/json',
    'Content-Length': Buffer.byteLength(body),
    ...extraHeaders,
  });
  res.end(body);
}

const OPENAI_TO_ANTHROPIC_FINISH = { stop: 'end_turn', length: 'max_tokens', content_filter: 'refusal', tool_calls: 'tool_use' };
const ANTHROPIC_TO_OPENAI_FINISH = Object.fromEntries(
  Object.entries(OPENAI_TO_ANTHROPIC_FINISH).map(([openai, anthropic]) => [anthropic, openai]),
);

/**
 * The finish reason of a step in the request's format. A step may name it in
 * either format (`stop` or `end_turn`, `length` or `max_tokens`, …); other
 * values are passed through as scripted.
 */
export function finishReason(format, step, hasToolCalls) {
  const requested = step.finish ?? (hasToolCalls ? 'tool_calls' : 'stop');
  if (format === 'anthropic') return OPENAI_TO_ANTHROPIC_FINISH[requested] ?? requested;
  return ANTHROPIC_TO_OPENAI_FINISH[requested] ?? requested;
}

/** Anthropic's error `type` for an HTTP status. */
export function anthropicErrorType(status) {
  switch (status) {
    case 400: return 'invalid_request_error';
    case 401: return 'authentication_error';
    case 403: return 'permission_error';
    case 404: return 'not_found_error';
    case 413: return 'request_too_large';
    case 429: return 'rate_limit_error';
    case 504: return 'timeout_error';
    case 529: return 'overloaded_error';
    default: return status >= 500 ? 'api_error' : 'invalid_request_error';
  }
}

/**
 * The JSON body of an `{ error: { status, body? } }` step in the request's
 * format: an object body is sent as is, a string becomes the message.
 */
export function errorBody(format, status, body) {
  if (body != null && typeof body === 'object') return body;
  const message = typeof body === 'string' ? body : `Mock error ${status}`;
  if (format === 'anthropic') return { type: 'error', error: { type: anthropicErrorType(status), message } };
  const type = typeof body === 'string' ? 'server_error' : status === 429 ? 'rate_limit_exceeded' : status >= 500 ? 'server_error' : 'invalid_request_error';
  return { error: { message, type, param: null, code: null } };
}

function invalidRequestBody(format, message) {
  return format === 'anthropic'
    ? { type: 'error', error: { type: 'invalid_request_error', message } }
    : { error: { message, type: 'invalid_request_error', param: null, code: null } };
}

/**
 * The argument text of a scripted tool call. `invalidArguments: true` makes
 * it invalid JSON (a trailing comma, a classic model mistake).
 */
export function callArguments(call) {
  const args = typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments ?? {});
  if (!call.invalidArguments) return args;
  return `${args.replace(/\}\s*$/, '')},}`;
}

/** A deterministic stand-in for Anthropic's opaque thinking signature. */
export function thinkingSignature(thinking) {
  return `EqMock${Buffer.from(`mock-signature:${thinking}`).toString('base64')}`;
}

/**
 * An Anthropic Messages request body in OpenAI chat shape (system message,
 * `tool_use` blocks as `tool_calls`, `tool_result` blocks as `tool` messages),
 * so the default policy serves both formats.
 */
export function anthropicToOpenAi(body) {
  const messages = [];
  const system = Array.isArray(body?.system) ? contentText(body.system) : body?.system;
  if (system) messages.push({ role: 'system', content: system });
  for (const message of Array.isArray(body?.messages) ? body.messages : []) {
    const blocks = typeof message?.content === 'string'
      ? [{ type: 'text', text: message.content }]
      : Array.isArray(message?.content) ? message.content : [];
    if (message?.role === 'assistant') {
      const text = blocks.filter((b) => b?.type === 'text').map((b) => b.text ?? '').join('');
      const toolCalls = blocks
        .filter((b) => b?.type === 'tool_use')
        .map((b) => ({ id: b.id, type: 'function', function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) } }));
      messages.push({ role: 'assistant', content: text || null, ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}) });
      continue;
    }
    let pending = null;
    const flush = () => {
      if (pending !== null) messages.push({ role: 'user', content: pending });
      pending = null;
    };
    for (const block of blocks) {
      if (block?.type === 'tool_result') {
        flush();
        const content = contentText(block.content);
        messages.push({ role: 'tool', tool_call_id: block.tool_use_id, content: block.is_error ? `Error: ${content}` : content });
      } else if (block?.type === 'text') {
        pending = (pending ?? '') + (block.text ?? '');
      }
    }
    flush();
  }
  const converted = { model: body?.model, messages };
  if (Array.isArray(body?.tools)) {
    converted.tools = body.tools.map((t) => ({
      type: 'function',
      function: { name: t?.name, description: t?.description, parameters: t?.input_schema },
    }));
  }
  return converted;
}

function sseData(value) {
  return `data: ${typeof value === 'string' ? value : JSON.stringify(value)}\n\n`;
}

function sseEvent(name, value) {
  return `event: ${name}\ndata: ${JSON.stringify(value)}\n\n`;
}

/** The first part of an SSE frame, cut in the middle of its JSON. */
function cutFrame(frame) {
  const brace = frame.indexOf('{');
  const json = frame.length - brace - 2;
  return frame.slice(0, brace + Math.max(2, Math.floor(json / 2)));
}

/**
 * OpenAI chat-completions frames. Each method returns the SSE frames (strings)
 * to write for one logical piece of the response.
 */
function openAiWire({ id, created, model, includeUsage, promptTokens }) {
  const chunk = (delta, finishReason = null) => {
    const value = {
      id,
      object: 'chat.completion.chunk',
      created,
      model,
      system_fingerprint: 'fp_mock',
      choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
    };
    if (includeUsage) value.usage = null;
    return value;
  };
  return {
    start: (content) => [sseData(chunk({ role: 'assistant', content }))],
    text: (piece) => [sseData(chunk({ content: piece }))],
    // What compatible servers (DeepSeek, vLLM, llama.cpp) send for reasoning.
    thinking: (piece) => [sseData(chunk({ reasoning_content: piece }))],
    signature: () => [],
    reasoningDetails: (fragments) => [sseData(chunk({ reasoning_details: fragments }))],
    // Gemini's compatible API puts a call's thought signature in `extra_content`.
    toolCall: (index, callId, name, fragments, extraContent) => [
      sseData(chunk({ tool_calls: [{ index, id: callId, type: 'function', function: { name, arguments: '' }, ...(extraContent ? { extra_content: extraContent } : {}) }] })),
      ...fragments.map((fragment) => sseData(chunk({ tool_calls: [{ index, function: { arguments: fragment } }] }))),
    ],
    finish: (reason, completionTokens) => {
      const frames = [sseData(chunk({}, reason))];
      if (includeUsage) {
        frames.push(sseData({
          id,
          object: 'chat.completion.chunk',
          created,
          model,
          system_fingerprint: 'fp_mock',
          choices: [],
          usage: { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens },
        }));
      }
      frames.push(sseData('[DONE]'));
      return frames;
    },
    error: (err) => [sseData({
      error: {
        message: err.message ?? 'The server had an error while processing your request.',
        type: err.type ?? 'server_error',
        param: null,
        code: err.code ?? null,
      },
    })],
    partial: () => cutFrame(sseData(chunk({ content: 'this chunk is cut off in the middle' }))),
  };
}

/** Anthropic Messages frames (`event:` + `data:`), tracking the open content block. */
function anthropicWire({ id, model, promptTokens }) {
  let index = -1;
  let open = null;
  const close = () => {
    if (open === null) return [];
    open = null;
    return [sseEvent('content_block_stop', { type: 'content_block_stop', index })];
  };
  const openBlock = (kind, block) => {
    const frames = close();
    index += 1;
    open = kind;
    frames.push(sseEvent('content_block_start', { type: 'content_block_start', index, content_block: block }));
    return frames;
  };
  const delta = (value) => sseEvent('content_block_delta', { type: 'content_block_delta', index, delta: value });
  const text = (piece) => [
    ...(open === 'text' ? [] : openBlock('text', { type: 'text', text: '' })),
    delta({ type: 'text_delta', text: piece }),
  ];
  return {
    start: (content) => [
      sseEvent('message_start', {
        type: 'message_start',
        message: {
          id,
          type: 'message',
          role: 'assistant',
          model,
          content: [],
          stop_reason: null,
          stop_sequence: null,
          usage: { input_tokens: promptTokens, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, output_tokens: 1 },
        },
      }),
      sseEvent('ping', { type: 'ping' }),
      ...(content ? text(content) : []),
    ],
    text,
    thinking: (piece) => [
      ...(open === 'thinking' ? [] : openBlock('thinking', { type: 'thinking', thinking: '', signature: '' })),
      delta({ type: 'thinking_delta', thinking: piece }),
    ],
    signature: (signature) => (open === 'thinking' ? [delta({ type: 'signature_delta', signature })] : []),
    toolCall: (_index, callId, name, fragments) => [
      ...openBlock('tool_use', { type: 'tool_use', id: callId, name, input: {} }),
      delta({ type: 'input_json_delta', partial_json: '' }),
      ...fragments.map((fragment) => delta({ type: 'input_json_delta', partial_json: fragment })),
      ...close(),
    ],
    finish: (reason, completionTokens) => [
      ...close(),
      sseEvent('message_delta', {
        type: 'message_delta',
        delta: { stop_reason: reason, stop_sequence: null },
        usage: { output_tokens: completionTokens },
      }),
      sseEvent('message_stop', { type: 'message_stop' }),
    ],
    error: (err) => [sseEvent('error', {
      type: 'error',
      error: { type: err.type ?? 'overloaded_error', message: err.message ?? 'Overloaded' },
    })],
    partial: () => cutFrame(sseEvent('content_block_delta', {
      type: 'content_block_delta',
      index: Math.max(index, 0),
      delta: { type: 'text_delta', text: 'this event is cut off in the middle' },
    })),
  };
}

/**
 * Starts the mock server.
 *
 * `keepBodies` (default true): whether the request log keeps each request's
 * parsed body once it is answered, for tests to inspect. Benchmarks pass
 * false. A long thread's requests are ~1.3 MB each, and a 200-step turn
 * sends ~200 of them: kept, they are tens of MB of JS objects in this
 * process whose garbage collection competes for the machine's two cores
 * with the browser the benchmark measures (BENCHMARKS.md item 26). Every
 * log entry has `bodyBytes` either way.
 * @param {{ port?: number, quiet?: boolean, keepBodies?: boolean }} [options]
 */
export async function startMockLlm(options = {}) {
  const port = options.port ?? 0;
  const keepBodies = options.keepBodies ?? true;
  let queue = [];
  let defaultChunkDelayMs = 0;
  let policy = options.policy ?? defaultPolicy;
  let requestLog = [];
  // Background title requests, kept apart from the log tests count.
  let titleLog = [];
  let compactionLog = [];
  let inFlight = 0;
  let completionCounter = 0;
  const openResponses = new Set();
  const waiters = new Set();

  const notifyWaiters = () => {
    for (const waiter of [...waiters]) {
      if (waiter.check()) {
        waiters.delete(waiter);
        waiter.resolve();
      }
    }
  };

  const promptTokensOf = (body, step) =>
    step.usage?.prompt_tokens ??
    step.usage?.input_tokens ??
    // Like a real provider: the system prompt and the tool schemas count too.
    estimateTokens(JSON.stringify([body?.system ?? '', body?.messages ?? [], body?.tools ?? []]));
  const completionTokensOf = (step, outputText) =>
    step.usage?.completion_tokens ?? step.usage?.output_tokens ?? estimateTokens(outputText);
  const modelOf = (body) => (typeof body?.model === 'string' && body.model ? body.model : MODEL_FALLBACK);
  const callIdOf = (format, call, n, index) => {
    if (call.id !== undefined) return call.id;
    return format === 'anthropic' ? `toolu_mock_${n}_${index}` : `call_mock_${n}_${index}`;
  };

  async function streamStep(req, res, entry, body, step, format) {
    completionCounter += 1;
    const n = completionCounter;
    const wire = format === 'anthropic'
      ? anthropicWire({ id: `msg_mock_${n}`, model: modelOf(body), promptTokens: promptTokensOf(body, step) })
      : openAiWire({
        id: `chatcmpl-mock-${n}`,
        created: Math.floor(Date.now() / 1000),
        model: modelOf(body),
        includeUsage: Boolean(body?.stream_options?.include_usage),
        promptTokens: promptTokensOf(body, step),
      });
    let closed = false;
    res.on('close', () => {
      closed = true;
    });
    const sendHeaders = () => {
      if (res.headersSent || closed) return;
      res.writeHead(200, {
        ...corsHeaders(req),
        'Content-Type': 'text/event-stream',
        'Cache-Control': 'no-cache',
        Connection: 'keep-alive',
        ...(format === 'anthropic' ? { 'request-id': `req_mock_${n}` } : {}),
      });
      if (typeof res.flushHeaders === 'function') res.flushHeaders();
    };
    const emit = async (frames, delayMs) => {
      for (const frame of frames) {
        if (closed) return false;
        if (delayMs > 0) await sleep(delayMs);
        if (closed) return false;
        sendHeaders();
        res.write(frame);
      }
      return !closed;
    };

    let outputText = '';
    let started = false;
    const start = (content, delayMs) => {
      started = true;
      return emit(wire.start(content), delayMs);
    };
    const sendText = (piece, delayMs) => (started ? emit(wire.text(piece), delayMs) : start(piece, delayMs));

    const play = async (current) => {
      const delay = current.chunkDelayMs ?? defaultChunkDelayMs;

      if (current.stallMs != null) {
        const stallAt = current.stallAt ?? 'delta';
        entry.outcome = 'stalled';
        if (stallAt === 'delta') {
          const stallText = current.text ?? 'Thinking';
          if (!(await sendText(stallText, 0))) return 'aborted';
          outputText += stallText;
        } else if (stallAt === 'headers') {
          sendHeaders();
        }
        const stallUntil = Date.now() + current.stallMs;
        const tickMs = current.tickMs > 0 ? current.tickMs : null;
        let nextTick = tickMs ? Date.now() + tickMs : Infinity;
        while (!closed && Date.now() < stallUntil) {
          await sleep(Math.min(50, Math.max(1, Math.min(stallUntil, nextTick) - Date.now())));
          if (!closed && Date.now() >= nextTick) {
            const tickText = current.tickText ?? '.';
            await sendText(tickText, 0);
            outputText += tickText;
            nextTick += tickMs;
          }
        }
        if (closed) return 'aborted';
        if (current.then) return play(current.then);
        return 'truncated';
      }

      const text = current.text ?? '';
      const thinking = current.thinking ?? '';
      const toolCalls = Array.isArray(current.toolCalls) ? current.toolCalls : [];
      if (!started) {
        if (!(await start(toolCalls.length > 0 && !text ? null : '', delay))) return 'aborted';
      }
      if (thinking) {
        for (const piece of splitText(thinking)) {
          if (!(await emit(wire.thinking(piece), delay))) return 'aborted';
          outputText += piece;
        }
        if (!(await emit(wire.signature(current.signature ?? thinkingSignature(thinking)), delay))) return 'aborted';
      }
      for (const fragments of wire.reasoningDetails && Array.isArray(current.reasoningDetails) ? current.reasoningDetails : []) {
        if (!(await emit(wire.reasoningDetails(fragments), delay))) return 'aborted';
      }
      for (const piece of text ? splitText(text) : []) {
        if (!(await emit(wire.text(piece), delay))) return 'aborted';
        outputText += piece;
      }
      if (current.midStreamError) {
        const err = typeof current.midStreamError === 'object' ? current.midStreamError : {};
        if (!(await emit(wire.error(err), delay))) return 'aborted';
        if (err.keepOpenMs > 0) {
          // A server that does not close after the error: the client must.
          const until = Date.now() + err.keepOpenMs;
          while (!closed && Date.now() < until) await sleep(Math.min(50, Math.max(1, until - Date.now())));
          if (closed) return 'aborted';
        }
        return 'error';
      }
      for (let index = 0; index < toolCalls.length; index += 1) {
        const call = toolCalls[index];
        const args = callArguments(call);
        outputText += call.name + args;
        const frames = wire.toolCall(index, callIdOf(format, call, n, index), call.name, splitArguments(args), call.extraContent);
        if (!(await emit(frames, delay))) return 'aborted';
      }
      if (current.truncate) {
        if (closed) return 'aborted';
        if (delay > 0) await sleep(delay);
        sendHeaders();
        // Wait until the partial frame left the process before closing.
        await new Promise((resolve) => res.write(wire.partial(), () => resolve()));
        return current.truncate === 'end' ? 'truncated_end' : 'truncated';
      }
      const finish = finishReason(format, current, toolCalls.length > 0);
      if (!(await emit(wire.finish(finish, completionTokensOf(current, outputText)), delay))) return 'aborted';
      return 'completed';
    };

    const outcome = await play(step);
    entry.outcome = outcome === 'truncated_end' ? 'truncated' : outcome;
    if (outcome === 'truncated') {
      // Simulates a dropped connection: the body is cut and the socket closed.
      res.destroy();
    } else if (!closed) {
      res.end();
    }
  }

  function completionJson(body, step) {
    completionCounter += 1;
    const toolCalls = Array.isArray(step.toolCalls) ? step.toolCalls : [];
    const text = step.text ?? '';
    const message = { role: 'assistant', content: text || (toolCalls.length ? null : '') };
    if (step.thinking) message.reasoning_content = step.thinking;
    if (toolCalls.length > 0) {
      message.tool_calls = toolCalls.map((call, index) => ({
        id: callIdOf('openai', call, completionCounter, index),
        type: 'function',
        function: { name: call.name, arguments: callArguments(call) },
      }));
    }
    const prompt = promptTokensOf(body, step);
    const completion = completionTokensOf(step, text + JSON.stringify(message.tool_calls ?? ''));
    return {
      id: `chatcmpl-mock-${completionCounter}`,
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: modelOf(body),
      system_fingerprint: 'fp_mock',
      choices: [
        {
          index: 0,
          message,
          logprobs: null,
          finish_reason: finishReason('openai', step, toolCalls.length > 0),
        },
      ],
      usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion },
    };
  }

  function messageJson(body, step) {
    completionCounter += 1;
    const toolCalls = Array.isArray(step.toolCalls) ? step.toolCalls : [];
    const text = step.text ?? '';
    const content = [];
    if (step.thinking) {
      content.push({ type: 'thinking', thinking: step.thinking, signature: step.signature ?? thinkingSignature(step.thinking) });
    }
    if (text) content.push({ type: 'text', text });
    toolCalls.forEach((call, index) => {
      let input = {};
      try {
        input = JSON.parse(callArguments(call));
      } catch {
        input = {};
      }
      content.push({ type: 'tool_use', id: callIdOf('anthropic', call, completionCounter, index), name: call.name, input });
    });
    return {
      id: `msg_mock_${completionCounter}`,
      type: 'message',
      role: 'assistant',
      model: modelOf(body),
      content,
      stop_reason: finishReason('anthropic', step, toolCalls.length > 0),
      stop_sequence: null,
      usage: {
        input_tokens: promptTokensOf(body, step),
        output_tokens: completionTokensOf(step, text + JSON.stringify(toolCalls)),
      },
    };
  }

  /** Why a Messages request would be rejected by the real API before any model work, or null. */
  function anthropicRequestProblem(req, body) {
    if (!req.headers['anthropic-version']) return 'anthropic-version: header is required';
    if (!Array.isArray(body?.messages)) return 'messages: Field required';
    if (!Number.isInteger(body?.max_tokens)) return 'max_tokens: Field required';
    return null;
  }

  async function handleCompletion(req, res, format) {
    const raw = await readBody(req);
    let body = null;
    try {
      body = raw ? JSON.parse(raw) : {};
    } catch {
      sendJson(req, res, 400, invalidRequestBody(format, 'Request body is not valid JSON.'));
      return;
    }
    const base = {
      index: requestLog.length,
      receivedAt: Date.now(),
      method: req.method,
      path: req.url,
      format,
      headers: { ...req.headers },
      body,
      bodyBytes: Buffer.byteLength(raw),
    };
    const problem = format === 'anthropic' ? anthropicRequestProblem(req, body) : null;
    if (problem) {
      // Rejected like the real API would, without consuming a scripted step.
      requestLog.push({ ...base, source: 'validation', step: null, outcome: 'rejected' });
      notifyWaiters();
      sendJson(req, res, 400, invalidRequestBody(format, problem));
      return;
    }
    // The engine's background title request (TITLE_PROMPT in src/engine/mod.rs)
    // is answered on the side: it neither consumes a scripted step nor
    // appears in the request log the tests count.
    const system = format === 'anthropic'
      ? (typeof body.system === 'string' ? body.system : '')
      : (Array.isArray(body.messages) && body.messages[0]?.role === 'system' ? String(body.messages[0].content ?? '') : '');
    const isTitle = system.startsWith('Write a short title');
    // Compaction requests (COMPACTION_PROMPT) are answered on the side too,
    // with a summary that counts them, and logged apart.
    const isCompaction = system.startsWith('You are compacting');
    const aside = isTitle || isCompaction;
    const scripted = !aside && queue.length > 0 ? queue.shift() : null;
    const policyBody = format === 'anthropic' ? anthropicToOpenAi(body) : body;
    const step = isTitle
      ? { text: 'Mock title' }
      : isCompaction
        ? { text: `Summary ${compactionLog.length + 1}: the user asked to look at the page many times; keep going.` }
        : !scripted || scripted.auto ? { ...policy(policyBody), ...(scripted ? { chunkDelayMs: scripted.chunkDelayMs } : {}) } : scripted;
    const entry = {
      ...base,
      source: isTitle ? 'title' : isCompaction ? 'compaction' : scripted && !scripted.auto ? 'script' : 'policy',
      step,
      outcome: 'pending',
    };
    if (isTitle) titleLog.push(entry);
    else if (isCompaction) compactionLog.push(entry);
    else requestLog.push(entry);
    inFlight += 1;
    notifyWaiters();
    try {
      if (step.redirect) {
        res.writeHead(step.redirect.status ?? 307, {
          ...corsHeaders(req),
          Location: step.redirect.location,
          'Content-Length': 0,
        });
        res.end();
        entry.outcome = 'redirected';
      } else if (step.json !== undefined) {
        sendJson(req, res, step.status ?? 200, step.json, step.headers ?? {});
        entry.outcome = 'completed';
      } else if (step.error) {
        const status = step.error.status ?? 500;
        const value = errorBody(format, status, step.error.body);
        const extra = step.error.headers ?? {};
        if (step.error.bodyBytes != null) {
          const bytes = Buffer.from(JSON.stringify(value).padEnd(step.error.bodyBytes, ' '));
          let closed = false;
          res.on('close', () => {
            closed = true;
          });
          res.writeHead(status, {
            ...corsHeaders(req, Object.keys(extra)),
            'Content-Type': 'application/json',
            'Content-Length': bytes.length,
            ...extra,
          });
          const CHUNK = 64 * 1024;
          for (let at = 0; at < bytes.length && !closed; at += CHUNK) {
            if (res.write(bytes.subarray(at, at + CHUNK))) continue;
            // Only as fast as the client reads: one that stops reading
            // and closes is seen here.
            await new Promise((resolve) => {
              const done = () => {
                res.off('drain', done);
                res.off('close', done);
                resolve();
              };
              res.on('drain', done);
              res.on('close', done);
            });
          }
          if (closed) {
            entry.outcome = 'aborted';
          } else {
            res.end();
            entry.outcome = 'error';
          }
        } else if (step.error.stallMs != null) {
          // Headers now, the body only after stallMs (unless the client gives up first).
          const text = JSON.stringify(value);
          let closed = false;
          res.on('close', () => {
            closed = true;
          });
          res.writeHead(status, {
            ...corsHeaders(req, Object.keys(extra)),
            'Content-Type': 'application/json',
            'Content-Length': Buffer.byteLength(text),
            ...extra,
          });
          // The first byte goes out with the headers (some browsers resolve
          // fetch only once body data arrived), the rest after the stall.
          res.write(text.slice(0, 1));
          entry.outcome = 'stalled';
          const until = Date.now() + step.error.stallMs;
          while (!closed && Date.now() < until) await sleep(Math.min(50, Math.max(1, until - Date.now())));
          if (closed) {
            entry.outcome = 'aborted';
          } else {
            res.end(text.slice(1));
            entry.outcome = 'error';
          }
        } else {
          sendJson(req, res, status, value, extra);
          entry.outcome = 'error';
        }
      } else if (body?.stream === true) {
        await streamStep(req, res, entry, body, step, format);
      } else if (step.midStreamError) {
        const err = typeof step.midStreamError === 'object' ? step.midStreamError : {};
        const status = err.status ?? (format === 'anthropic' ? 529 : 500);
        sendJson(req, res, status, errorBody(format, status, err.message));
        entry.outcome = 'error';
      } else {
        const effective = step.stallMs != null ? { text: step.text ?? 'Thinking', ...(step.then ?? {}) } : step;
        const value = format === 'anthropic' ? messageJson(body, effective) : completionJson(body, effective);
        if (step.truncate) {
          const text = JSON.stringify(value);
          res.writeHead(200, { ...corsHeaders(req), 'Content-Type': 'application/json' });
          await new Promise((resolve) => res.write(text.slice(0, Math.floor(text.length / 2)), () => resolve()));
          res.destroy();
          entry.outcome = 'truncated';
        } else {
          sendJson(req, res, 200, value);
          entry.outcome = 'completed';
        }
      }
    } finally {
      if (!keepBodies) entry.body = null;
      inFlight -= 1;
      notifyWaiters();
    }
  }

  async function handleControl(req, res, pathname) {
    if (req.method === 'GET' && pathname === '/__control/requests') {
      sendJson(req, res, 200, requestLog);
      return;
    }
    if (req.method === 'GET' && pathname === '/__control/titles') {
      sendJson(req, res, 200, titleLog);
      return;
    }
    if (req.method === 'GET' && pathname === '/__control/compactions') {
      sendJson(req, res, 200, compactionLog);
      return;
    }
    if (req.method === 'GET' && pathname === '/__control/state') {
      sendJson(req, res, 200, { pendingSteps: queue.length, requestCount: requestLog.length, inFlight });
      return;
    }
    if (req.method === 'POST' && pathname === '/__control/reset') {
      queue = [];
      requestLog = [];
      titleLog = [];
      compactionLog = [];
      defaultChunkDelayMs = 0;
      sendJson(req, res, 200, { ok: true });
      return;
    }
    if (req.method === 'POST' && pathname === '/__control/script') {
      let parsed;
      try {
        parsed = JSON.parse((await readBody(req)) || '{}');
      } catch {
        sendJson(req, res, 400, { error: 'body must be JSON { steps: [...] }' });
        return;
      }
      if (!Array.isArray(parsed.steps)) {
        sendJson(req, res, 400, { error: 'body must be JSON { steps: [...] }' });
        return;
      }
      queue = [...parsed.steps];
      if (typeof parsed.chunkDelayMs === 'number') defaultChunkDelayMs = parsed.chunkDelayMs;
      sendJson(req, res, 200, { ok: true, pendingSteps: queue.length });
      return;
    }
    sendJson(req, res, 404, { error: `unknown control endpoint ${req.method} ${pathname}` });
  }

  const server = http.createServer(async (req, res) => {
    openResponses.add(res);
    res.on('close', () => openResponses.delete(res));
    try {
      const pathname = new URL(req.url, `http://${HOST}`).pathname;
      if (req.method === 'OPTIONS') {
        res.writeHead(204, corsHeaders(req));
        res.end();
        return;
      }
      if (pathname.startsWith('/__control/')) {
        await handleControl(req, res, pathname);
        return;
      }
      if (req.method === 'POST' && pathname.endsWith('/chat/completions')) {
        await handleCompletion(req, res, 'openai');
        return;
      }
      if (req.method === 'POST' && pathname.endsWith('/messages')) {
        await handleCompletion(req, res, 'anthropic');
        return;
      }
      if (req.method === 'GET' && pathname.endsWith('/models')) {
        sendJson(req, res, 200, {
          object: 'list',
          data: [{ id: MODEL_FALLBACK, object: 'model', created: 0, owned_by: 'mock' }],
        });
        return;
      }
      sendJson(req, res, 404, {
        error: { message: `Unknown path ${pathname}`, type: 'invalid_request_error', param: null, code: 'not_found' },
      });
    } catch (error) {
      if (!options.quiet) console.error('mock-llm: handler error', error);
      if (!res.headersSent) sendJson(req, res, 500, { error: { message: String(error), type: 'server_error' } });
      else res.destroy();
    }
  });

  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, HOST, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const actualPort = server.address().port;
  const origin = `http://${HOST}:${actualPort}`;

  return {
    url: `${origin}/v1`,
    origin,
    port: actualPort,
    /** Replaces the queue of scripted responses. */
    setScript(steps, { chunkDelayMs } = {}) {
      queue = [...steps];
      if (typeof chunkDelayMs === 'number') defaultChunkDelayMs = chunkDelayMs;
    },
    /** Replaces the policy that answers when no scripted step is queued (null: the default one). */
    setPolicy(fn) {
      policy = fn ?? defaultPolicy;
    },
    /** Every provider request received so far (live entries; copy before mutating). */
    requests() {
      return requestLog;
    },
    /** Compaction requests answered on the side. */
    compactions() {
      return compactionLog;
    },
    pendingSteps() {
      return queue.length;
    },
    reset() {
      queue = [];
      requestLog = [];
      titleLog = [];
      compactionLog = [];
      defaultChunkDelayMs = 0;
      policy = options.policy ?? defaultPolicy;
    },
    /** Resolves once at least `count` provider requests were received. */
    waitForRequests(count, { timeout = 60000 } = {}) {
      return new Promise((resolve, reject) => {
        const waiter = { check: () => requestLog.length >= count, resolve: () => { clearTimeout(timer); resolve(requestLog); } };
        const timer = setTimeout(() => {
          waiters.delete(waiter);
          reject(new Error(`mock-llm: timed out waiting for ${count} requests (got ${requestLog.length})`));
        }, timeout);
        if (waiter.check()) waiter.resolve();
        else waiters.add(waiter);
      });
    },
    async close() {
      for (const res of openResponses) res.destroy();
      if (typeof server.closeAllConnections === 'function') server.closeAllConnections();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

function parseArgs(argv) {
  const args = { port: 0, script: null };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === '--port') args.port = Number(argv[++i]);
    else if (argv[i] === '--script') args.script = argv[++i];
    else if (argv[i] === '--help' || argv[i] === '-h') {
      process.stdout.write('usage: node tests/mock-llm/server.mjs [--port N] [--script steps.json]\n');
      process.exit(0);
    } else {
      process.stderr.write(`mock-llm: unknown argument ${argv[i]}\n`);
      process.exit(2);
    }
  }
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) {
    process.stderr.write('mock-llm: --port must be an integer 0..65535\n');
    process.exit(2);
  }
  return args;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const args = parseArgs(process.argv.slice(2));
  const mock = await startMockLlm({ port: args.port });
  if (args.script) {
    const parsed = JSON.parse(readFileSync(args.script, 'utf8'));
    mock.setScript(Array.isArray(parsed) ? parsed : parsed.steps ?? [], { chunkDelayMs: parsed.chunkDelayMs });
  }
  process.stdout.write(`MOCK_LLM_URL=${mock.url}\n`);
  const stop = async () => {
    await mock.close();
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
