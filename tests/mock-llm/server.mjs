// Mock OpenAI-compatible chat-completions server for the demo and the tests.
//
// Owns: the OpenAI streaming wire format (SSE `chat.completion.chunk`s, split
// text deltas, tool-call deltas split into fragments, finish_reason, the usage
// chunk, `[DONE]`), a scriptable queue of responses, a deterministic default
// policy (a "tiny agent" that reads the page, clicks the best-matching element
// and reports), and a log of every provider request for assertions.
// Must not: listen on anything but 127.0.0.1, depend on any package, or reach
// the network.
//
// CLI:  node tests/mock-llm/server.mjs [--port N] [--script steps.json]
//       prints `MOCK_LLM_URL=http://127.0.0.1:<port>/v1` as its first stdout
//       line and serves until killed.
// In-process: `startMockLlm({ port })` → { url, origin, close, setScript,
//       requests, reset, waitForRequests }.
//
// Control API (same port):
//   POST /__control/script   { steps: Step[], chunkDelayMs? }  replace the queue
//   GET  /__control/requests  every provider request received so far
//   GET  /__control/state     { pendingSteps, requestCount, inFlight }
//   POST /__control/reset     empty queue and request log
//
// Step forms (each provider request consumes one; empty queue = default policy):
//   { text, chunkDelayMs?, finish? }          finish: stop (default) | length | content_filter
//   { toolCalls: [{ name, arguments, id? }], text?, finish? }   finish defaults to tool_calls
//   { error: { status, body? } }              HTTP error with an OpenAI error JSON body
//   { stallMs, text?, tickMs?, tickText?, then? }
//                                             headers + one text delta (`text`, default
//                                             "Thinking"), wait stallMs (sending `tickText`,
//                                             default ".", every tickMs if given), then
//                                             continue with step `then` or, without it,
//                                             end the body abruptly (no finish, no [DONE])
//   { auto: true, chunkDelayMs? }             the default policy for this request
// Any step may carry `usage: { prompt_tokens, completion_tokens }` to override
// the computed usage.

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

function corsHeaders(req) {
  const requested = req.headers['access-control-request-headers'];
  const allowHeaders = ['authorization', 'content-type'];
  if (requested) {
    for (const h of String(requested).split(',')) {
      const name = h.trim().toLowerCase();
      if (name && !allowHeaders.includes(name)) allowHeaders.push(name);
    }
  }
  const headers = {
    'Access-Control-Allow-Origin': '*',
    'Access-Control-Allow-Methods': 'GET, POST, OPTIONS',
    'Access-Control-Allow-Headers': allowHeaders.join(', '),
    'Access-Control-Max-Age': '600',
  };
  if (req.headers['access-control-request-private-network']) {
    headers['Access-Control-Allow-Private-Network'] = 'true';
  }
  return headers;
}

function sendJson(req, res, status, value) {
  const body = JSON.stringify(value);
  res.writeHead(status, {
    ...corsHeaders(req),
    'Content-Type': 'application/json',
    'Content-Length': Buffer.byteLength(body),
  });
  res.end(body);
}

/**
 * Starts the mock server.
 * @param {{ port?: number, quiet?: boolean }} [options]
 */
export async function startMockLlm(options = {}) {
  const port = options.port ?? 0;
  let queue = [];
  let defaultChunkDelayMs = 0;
  let requestLog = [];
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

  async function streamStep(req, res, entry, body, step) {
    const includeUsage = Boolean(body?.stream_options?.include_usage);
    const model = typeof body?.model === 'string' && body.model ? body.model : MODEL_FALLBACK;
    completionCounter += 1;
    const id = `chatcmpl-mock-${completionCounter}`;
    const created = Math.floor(Date.now() / 1000);
    let closed = false;
    res.on('close', () => {
      closed = true;
    });

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
    const send = async (value, delayMs) => {
      if (closed) return false;
      if (delayMs > 0) await sleep(delayMs);
      if (closed) return false;
      res.write(`data: ${JSON.stringify(value)}\n\n`);
      return true;
    };

    res.writeHead(200, {
      ...corsHeaders(req),
      'Content-Type': 'text/event-stream',
      'Cache-Control': 'no-cache',
      Connection: 'keep-alive',
    });
    if (typeof res.flushHeaders === 'function') res.flushHeaders();

    let outputText = '';
    let roleSent = false;

    const play = async (current) => {
      const delay = current.chunkDelayMs ?? defaultChunkDelayMs;

      if (current.stallMs != null) {
        const stallText = current.text ?? 'Thinking';
        entry.outcome = 'stalled';
        if (!(await send(chunk({ role: 'assistant', content: stallText }), 0))) return 'aborted';
        roleSent = true;
        outputText += stallText;
        const stallUntil = Date.now() + current.stallMs;
        const tickMs = current.tickMs > 0 ? current.tickMs : null;
        let nextTick = tickMs ? Date.now() + tickMs : Infinity;
        while (!closed && Date.now() < stallUntil) {
          await sleep(Math.min(50, Math.max(1, Math.min(stallUntil, nextTick) - Date.now())));
          if (!closed && Date.now() >= nextTick) {
            const tickText = current.tickText ?? '.';
            res.write(`data: ${JSON.stringify(chunk({ content: tickText }))}\n\n`);
            outputText += tickText;
            nextTick += tickMs;
          }
        }
        if (closed) return 'aborted';
        if (current.then) return play(current.then);
        return 'truncated';
      }

      const text = current.text ?? '';
      const toolCalls = Array.isArray(current.toolCalls) ? current.toolCalls : [];
      if (!roleSent) {
        const first = toolCalls.length > 0 && !text ? { role: 'assistant', content: null } : { role: 'assistant', content: '' };
        if (!(await send(chunk(first), delay))) return 'aborted';
        roleSent = true;
      }
      for (const piece of text ? splitText(text) : []) {
        if (!(await send(chunk({ content: piece }), delay))) return 'aborted';
        outputText += piece;
      }
      for (let index = 0; index < toolCalls.length; index += 1) {
        const call = toolCalls[index];
        const callId = call.id !== undefined ? call.id : `call_mock_${completionCounter}_${index}`;
        const args = typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments ?? {});
        outputText += call.name + args;
        const head = { index, id: callId, type: 'function', function: { name: call.name, arguments: '' } };
        if (!(await send(chunk({ tool_calls: [head] }), delay))) return 'aborted';
        for (const fragment of splitArguments(args)) {
          if (!(await send(chunk({ tool_calls: [{ index, function: { arguments: fragment } }] }), delay))) return 'aborted';
        }
      }
      const finish = current.finish ?? (toolCalls.length > 0 ? 'tool_calls' : 'stop');
      if (!(await send(chunk({}, finish), delay))) return 'aborted';
      if (includeUsage) {
        const usage = current.usage ?? {};
        const prompt = usage.prompt_tokens ?? estimateTokens(JSON.stringify(body?.messages ?? []));
        const completion = usage.completion_tokens ?? estimateTokens(outputText);
        const usageChunk = {
          id,
          object: 'chat.completion.chunk',
          created,
          model,
          system_fingerprint: 'fp_mock',
          choices: [],
          usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion },
        };
        if (!(await send(usageChunk, delay))) return 'aborted';
      }
      if (closed) return 'aborted';
      res.write('data: [DONE]\n\n');
      return 'completed';
    };

    const outcome = await play(step);
    entry.outcome = outcome;
    if (outcome === 'truncated') {
      // Simulates a dropped connection: no finish_reason, no [DONE].
      res.destroy();
    } else if (!closed) {
      res.end();
    }
  }

  function completionJson(body, step) {
    const model = typeof body?.model === 'string' && body.model ? body.model : MODEL_FALLBACK;
    completionCounter += 1;
    const toolCalls = Array.isArray(step.toolCalls) ? step.toolCalls : [];
    const text = step.text ?? '';
    const message = { role: 'assistant', content: text || (toolCalls.length ? null : '') };
    if (toolCalls.length > 0) {
      message.tool_calls = toolCalls.map((call, index) => ({
        id: call.id !== undefined ? call.id : `call_mock_${completionCounter}_${index}`,
        type: 'function',
        function: {
          name: call.name,
          arguments: typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments ?? {}),
        },
      }));
    }
    const prompt = step.usage?.prompt_tokens ?? estimateTokens(JSON.stringify(body?.messages ?? []));
    const completion = step.usage?.completion_tokens ?? estimateTokens(text + JSON.stringify(message.tool_calls ?? ''));
    return {
      id: `chatcmpl-mock-${completionCounter}`,
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model,
      system_fingerprint: 'fp_mock',
      choices: [
        {
          index: 0,
          message,
          logprobs: null,
          finish_reason: step.finish ?? (toolCalls.length > 0 ? 'tool_calls' : 'stop'),
        },
      ],
      usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion },
    };
  }

  async function handleCompletion(req, res) {
    const raw = await readBody(req);
    let body = null;
    try {
      body = raw ? JSON.parse(raw) : {};
    } catch {
      sendJson(req, res, 400, {
        error: { message: 'Request body is not valid JSON.', type: 'invalid_request_error', param: null, code: null },
      });
      return;
    }
    const scripted = queue.length > 0 ? queue.shift() : null;
    const step = !scripted || scripted.auto ? { ...defaultPolicy(body), ...(scripted ? { chunkDelayMs: scripted.chunkDelayMs } : {}) } : scripted;
    const entry = {
      index: requestLog.length,
      receivedAt: Date.now(),
      method: req.method,
      path: req.url,
      headers: { ...req.headers },
      body,
      source: scripted && !scripted.auto ? 'script' : 'policy',
      step,
      outcome: 'pending',
    };
    requestLog.push(entry);
    inFlight += 1;
    notifyWaiters();
    try {
      if (step.error) {
        const status = step.error.status ?? 500;
        const errorBody = step.error.body ?? {
          error: {
            message: `Mock error ${status}`,
            type: status === 429 ? 'rate_limit_exceeded' : status >= 500 ? 'server_error' : 'invalid_request_error',
            param: null,
            code: null,
          },
        };
        sendJson(req, res, status, typeof errorBody === 'string' ? { error: { message: errorBody, type: 'server_error', param: null, code: null } } : errorBody);
        entry.outcome = 'error';
      } else if (body?.stream === true) {
        await streamStep(req, res, entry, body, step);
      } else {
        sendJson(req, res, 200, completionJson(body, step.stallMs != null ? { text: step.text ?? 'Thinking', ...(step.then ?? {}) } : step));
        entry.outcome = 'completed';
      }
    } finally {
      inFlight -= 1;
      notifyWaiters();
    }
  }

  async function handleControl(req, res, pathname) {
    if (req.method === 'GET' && pathname === '/__control/requests') {
      sendJson(req, res, 200, requestLog);
      return;
    }
    if (req.method === 'GET' && pathname === '/__control/state') {
      sendJson(req, res, 200, { pendingSteps: queue.length, requestCount: requestLog.length, inFlight });
      return;
    }
    if (req.method === 'POST' && pathname === '/__control/reset') {
      queue = [];
      requestLog = [];
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
        await handleCompletion(req, res);
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
    /** Every provider request received so far (live entries; copy before mutating). */
    requests() {
      return requestLog;
    },
    pendingSteps() {
      return queue.length;
    },
    reset() {
      queue = [];
      requestLog = [];
      defaultChunkDelayMs = 0;
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
