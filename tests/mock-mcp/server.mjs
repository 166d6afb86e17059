// Mock MCP server for the tests and the demo: MCP's Streamable HTTP
// transport (protocol revisions 2025-06-18 and 2025-03-26) on 127.0.0.1.
//
// Owns: the one MCP endpoint (`/mcp`). POST: JSON-RPC requests,
// notifications and responses; `initialize` (the revision agreed on, an
// `Mcp-Session-Id`, `capabilities.tools.listChanged`), the checks a real
// server makes on every later message (the session id known, else 404; the
// `MCP-Protocol-Version` header of the session; an Accept of both
// application/json and text/event-stream, else 406; a JSON body, else
// 415/400), answers as one JSON body or as an event stream
// (`event: message`) carrying progress notifications, other notifications
// and requests of the server's before the result, `ping` (an empty result),
// `tools/list` in pages (`nextCursor`), `tools/call` of scripted tools,
// `notifications/cancelled` (the running call's signal aborts, and a request
// of the server's it waits on stops waiting), elicitation
// (`elicitation/create` on a call's event stream, only to a client whose
// `initialize` declared `capabilities.elicitation`; the client's answer is a
// POST of its own, 202). GET: the server-initiated event stream of a session
// (only with `listChanged`, else 405; the same session and version checks
// as POST; an Accept listing text/event-stream, else 406), on which
// `notifications/tools/list_changed` goes out when the tools change; several
// per session. DELETE: forgets the session (and ends its GET streams).
// Also: sessions forgotten on demand, and a log of every message for
// assertions.
// Must not: listen on anything but 127.0.0.1, depend on any package, or reach
// the network.
//
// CLI:  node tests/mock-mcp/server.mjs [--port N]
//       prints `MOCK_MCP_URL=http://127.0.0.1:<port>/mcp` as its first
//       stdout line and serves the demo tools (demoTools) until killed.
// In-process: `startMockMcp({ port, tools, pageSize, answer, versions,
//   listChanged })` →
//   { url, origin, state, log, calls, cancellations, responses,
//     elicitations, elicitationResponses, streams, sent, tickets, bookings,
//     toolNames, setTools, notifyListChanged, closeStreams, streamCount,
//     setDown, expireSessions, sessionCount, waitFor, reset, close }.
//   `tools`: [{ name, description, inputSchema, annotations?, title?,
//     answer?: 'json'|'sse', run(args, ctx) → CallToolResult }]
//     (default: demoTools(state), which include `add_faq_tool`: it publishes
//     a new read-only tool `faq_<topic>` and notifies list_changed).
//   ctx: { signal, progress(progress, total?, message?), notify(method,
//     params?) → true if sent (a notification on this call's event stream;
//     false once the stream closed or in a JSON answer), ask(method, params)
//     → the client's answer (a JSON-RPC response object; e.g.
//     `ask('ping', {})`: the client must answer `ping` with an empty result,
//     `{ jsonrpc, id, result: {} }`, POSTed like any answer, 202),
//     elicit(message, requestedSchema) → the client's answer to
//     `elicitation/create` (a JSON-RPC response object; rejects when the call
//     is cancelled or its stream closes), clientCapabilities (of the
//     session's initialize), canElicit, sleep(ms) }.
//   `answer`: 'sse' (default) or 'json', how results are sent unless a tool
//   says otherwise; progress, ctx.notify and server requests need 'sse'.
//   `listChanged` (default true): what `initialize` declares in
//   `capabilities.tools.listChanged`, and whether GET opens an event stream
//   (false: GET is 405, as a server without one answers).
//   setTools(tools, { notify = true }) → the number of GET streams notified:
//     the next tools/list lists `tools`; with notify, every open GET stream
//     gets `notifications/tools/list_changed`. notifyListChanged() → that
//     number too, tools unchanged. closeStreams() → how many open GET streams
//     the server ended (res.end()); streamCount(session?) → how many are open
//     (of one session). setDown(status) answers every message, GET included,
//     with `status` (open streams stay open). expireSessions() forgets every
//     session and ends their GET streams; reset() and close() end every GET
//     stream (close() destroys them: it never waits on an open stream).
//   `log` entries: { kind: request|notification|response|rejected|
//     elicitation|elicitation-response|stream|sent|delete, method?, id?,
//     params?, headers, status, session }. `elicitation` is the server's
//     `elicitation/create` as sent on a call's stream (with that call's
//     headers, `callId` the call's JSON-RPC id, `answered` once the client
//     answered); `elicitation-response` the client's POST answering one
//     (`action`, `content`, `requestSession`: the session the question was
//     asked in, `late`: it answered nothing that still waited).
//     `stream` a GET event stream opened (method 'GET', status 200, `stream`:
//     its number from 1, `closed`: false until it ends, then true with
//     `closedAt` (Date.now()) and `closedBy`: 'client'|'server'); a refused
//     GET is a `rejected` entry with method 'GET'. `sent` a notification the
//     server sent: { kind: 'sent', method, params?, session, stream, headers
//     (the GET's) } per GET stream written, or { kind: 'sent', method,
//     params?, session, callId, headers (the call's) } for ctx.notify on a
//     call's stream. `delete` a DELETE of a session (status 200).

import http from 'node:http';
import { fileURLToPath } from 'node:url';

const HOST = '127.0.0.1';
export const SUPPORTED_VERSIONS = ['2025-06-18', '2025-03-26'];

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason ?? new Error('aborted'));
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(signal.reason ?? new Error('aborted'));
    }, { once: true });
  });
}

const text = (value) => ({ content: [{ type: 'text', text: value }] });

/** The form `book_table` asks the user to fill in (elicitation/create's requestedSchema). */
export const BOOKING_SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', title: 'Your name', minLength: 2, maxLength: 60 },
    email: { type: 'string', format: 'email', title: 'Email', description: 'The confirmation goes there.' },
    partySize: { type: 'integer', title: 'Guests', minimum: 1, maximum: 12, default: 2 },
    seating: {
      type: 'string',
      title: 'Seating',
      enum: ['indoor', 'terrace', 'bar'],
      enumNames: ['Indoors', 'On the terrace', 'At the bar'],
    },
    highChair: { type: 'boolean', title: 'High chair needed', description: 'For a small child.', default: false },
  },
  required: ['name', 'email', 'partySize'],
};

/** The form `check_availability` (a read) asks the user to fill in. */
export const AVAILABILITY_SCHEMA = {
  type: 'object',
  properties: { day: { type: 'string', format: 'date', title: 'Day' } },
  required: ['day'],
};

export const AVAILABILITY_MESSAGE = 'Which day shall I look at?';

export const BOOKING_MESSAGE = 'Who is the table for? The restaurant needs a name, an email and the number of guests.';

/**
 * Where an accepted booking's `content` does not fit BOOKING_SCHEMA, in words
 * (null: it fits), as a server checks what it is given.
 */
export function bookingProblem(content) {
  if (content === null || typeof content !== 'object' || Array.isArray(content)) return 'no content';
  for (const name of BOOKING_SCHEMA.required) {
    if (content[name] === undefined) return `${name} is missing`;
  }
  for (const [name, value] of Object.entries(content)) {
    const field = BOOKING_SCHEMA.properties[name];
    if (!field) return `${name} is not a field of the form`;
    if (field.type === 'integer' && !Number.isInteger(value)) return `${name} is not an integer: ${JSON.stringify(value)}`;
    if (field.type === 'integer' && (value < field.minimum || value > field.maximum)) return `${name} is out of range: ${value}`;
    if (field.type === 'boolean' && typeof value !== 'boolean') return `${name} is not a boolean: ${JSON.stringify(value)}`;
    if (field.type === 'string' && typeof value !== 'string') return `${name} is not a string: ${JSON.stringify(value)}`;
    if (field.enum && !field.enum.includes(value)) return `${name} is not one of ${field.enum.join(', ')}: ${JSON.stringify(value)}`;
    if (field.format === 'email' && !/^[^\s@]+@[^\s@]+$/.test(value)) return `${name} is not an email address: ${JSON.stringify(value)}`;
    if (field.minLength !== undefined && [...value].length < field.minLength) return `${name} is too short`;
    if (field.maxLength !== undefined && [...value].length > field.maxLength) return `${name} is too long`;
  }
  return null;
}

/**
 * The demo tools: a docs search (read), a ticket desk (write), a slow report
 * with progress (read), a tool that fails, one that asks the client for
 * a model answer (sampling, which the engine refuses), a table booking
 * (write) that asks the user for the booking's details (elicitation), and
 * an availability check (read) that asks the user for a day, and
 * `add_faq_tool` (write), which publishes a new read-only tool and tells the
 * clients' GET streams (`notifications/tools/list_changed`): it needs
 * `state.publishTool(tool)` (startMockMcp gives its state one; without it
 * the call fails with isError).
 */
export function demoTools(state) {
  return [
    {
      name: 'search',
      title: 'Search the docs',
      description: 'Search the product documentation. Returns the best matching passages.',
      annotations: { readOnlyHint: true },
      inputSchema: {
        type: 'object',
        properties: { query: { type: 'string', description: 'What to look for.' } },
        required: ['query'],
      },
      run: ({ query }) => ({
        content: [{ type: 'text', text: `2 passages for "${query}":\n1. Refunds are paid within 14 days.\n2. A refund needs the order number.` }],
        structuredContent: { query, passages: 2 },
      }),
    },
    {
      name: 'create_ticket',
      description: 'Open a support ticket.',
      inputSchema: {
        type: 'object',
        properties: { subject: { type: 'string' }, body: { type: 'string' } },
        required: ['subject'],
      },
      run: ({ subject }) => {
        state.tickets.push(subject);
        return text(`Opened ticket T-${state.tickets.length}: ${subject}`);
      },
    },
    {
      name: 'slow_report',
      title: 'Build a report',
      description: 'Build a usage report; takes `steps` × 300 ms and reports progress.',
      annotations: { readOnlyHint: true },
      inputSchema: {
        type: 'object',
        properties: { steps: { type: 'integer', minimum: 1, maximum: 1000 } },
      },
      run: async ({ steps = 3 }, ctx) => {
        for (let i = 1; i <= steps; i += 1) {
          await ctx.sleep(300);
          ctx.progress(i, steps, `Step ${i} of ${steps}`);
        }
        return text(`The report has ${steps} sections.`);
      },
    },
    {
      name: 'broken',
      description: 'Always fails.',
      inputSchema: { type: 'object', properties: {} },
      run: () => ({ content: [{ type: 'text', text: 'The database is down.' }], isError: true }),
    },
    {
      name: 'ask_model',
      description: 'Asks the client to sample a model answer.',
      annotations: { readOnlyHint: true },
      inputSchema: { type: 'object', properties: {} },
      run: async (_args, ctx) => {
        const answer = await ctx.ask('sampling/createMessage', {
          messages: [{ role: 'user', content: { type: 'text', text: 'Hi' } }],
          maxTokens: 10,
        });
        return text(answer.error ? `The client refused: ${answer.error.code} ${answer.error.message}` : 'The client sampled.');
      },
    },
    {
      name: 'book_table',
      title: 'Book a table',
      description: 'Book a table at the restaurant. Asks the user who it is for (name, email, guests, seating).',
      inputSchema: {
        type: 'object',
        properties: { date: { type: 'string', description: 'The day, as YYYY-MM-DD.' } },
      },
      run: async ({ date }, ctx) => {
        if (!ctx.canElicit) {
          return {
            content: [{ type: 'text', text: 'This client cannot answer questions (it declared no elicitation capability): the booking needs a name, an email and the number of guests.' }],
            isError: true,
          };
        }
        const answer = await ctx.elicit(BOOKING_MESSAGE, BOOKING_SCHEMA);
        if (answer.error) return { content: [{ type: 'text', text: `The client refused: ${answer.error.code} ${answer.error.message}` }], isError: true };
        const action = answer.result?.action;
        if (action === 'decline') return text('Booking declined');
        if (action === 'cancel') return text('Booking cancelled');
        if (action !== 'accept') return { content: [{ type: 'text', text: `Unknown action: ${JSON.stringify(action)}` }], isError: true };
        const content = answer.result.content;
        const problem = bookingProblem(content);
        if (problem) return { content: [{ type: 'text', text: `Invalid booking: ${problem}` }], isError: true };
        state.bookings.push({ date: date ?? null, ...content });
        const seating = content.seating ? `, seating: ${content.seating}` : '';
        const chair = content.highChair === undefined ? '' : `, high chair: ${content.highChair ? 'yes' : 'no'}`;
        return {
          content: [{ type: 'text', text: `Booked for ${content.partySize}${date ? ` on ${date}` : ''} (name: ${content.name}, email: ${content.email}${seating}${chair})` }],
          structuredContent: { booking: state.bookings.length, ...content },
        };
      },
    },
    {
      name: 'check_availability',
      title: 'Check availability',
      description: 'Say which tables are free on a day. Asks the user which day.',
      annotations: { readOnlyHint: true },
      inputSchema: { type: 'object', properties: {} },
      run: async (_args, ctx) => {
        if (!ctx.canElicit) return { content: [{ type: 'text', text: 'This client cannot answer questions.' }], isError: true };
        const answer = await ctx.elicit(AVAILABILITY_MESSAGE, AVAILABILITY_SCHEMA);
        const action = answer.result?.action;
        if (action !== 'accept') return text(`No day given (${action ?? 'error'})`);
        return text(`Tables free on ${answer.result.content.day}: 3`);
      },
    },
    {
      name: 'add_faq_tool',
      title: 'Publish a FAQ tool',
      description: 'Publish a new tool that answers questions about a topic. The server\'s tool list changes.',
      inputSchema: {
        type: 'object',
        properties: { topic: { type: 'string', description: 'What the new tool answers questions about.' } },
        required: ['topic'],
      },
      run: ({ topic }) => {
        if (typeof topic !== 'string' || !faqName(topic)) {
          return { content: [{ type: 'text', text: 'The topic needs a letter or a digit.' }], isError: true };
        }
        if (typeof state.publishTool !== 'function') {
          return { content: [{ type: 'text', text: 'This server cannot publish tools.' }], isError: true };
        }
        const tool = faqTool(topic);
        state.publishTool(tool);
        return text(`Published ${tool.name}.`);
      },
    },
  ];
}

/**
 * The name `add_faq_tool` gives a topic's tool, without `faq_`: lower case,
 * accents dropped, every run of characters other than [a-z0-9] one `_`, no
 * `_` at either end, at most 20 characters ('' when nothing is left).
 */
export function faqName(topic) {
  return String(topic)
    .normalize('NFKD')
    .replace(/[\u0300-\u036f]/g, '')
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '_')
    .replace(/^_+|_+$/g, '')
    .slice(0, 20)
    .replace(/_+$/, '');
}

/** The read-only tool `add_faq_tool` publishes for `topic`. */
export function faqTool(topic) {
  return {
    name: `faq_${faqName(topic)}`,
    description: `Answer questions about ${topic}.`,
    annotations: { readOnlyHint: true },
    inputSchema: {
      type: 'object',
      properties: { question: { type: 'string', description: 'The question.' } },
    },
    run: () => text(`FAQ on ${topic}: see the help centre.`),
  };
}

export async function startMockMcp(options = {}) {
  const state = { tickets: [], bookings: [] };
  let tools = options.tools ?? demoTools(state);
  const pageSize = options.pageSize ?? 2;
  const defaultAnswer = options.answer ?? 'sse';
  const versions = options.versions ?? SUPPORTED_VERSIONS;
  const listChanged = options.listChanged ?? true;
  const sessions = new Map();
  let sessionCounter = 0;
  let serverRequestCounter = 0;
  let elicitationCounter = 0;
  let log = [];
  const running = new Map(); // `${session} ${id}` → AbortController
  const askedByServer = new Map(); // server request id → resolve
  const elicitationsAsked = new Map(); // elicitation id → its log entry
  const waiters = new Set();
  const streams = new Set(); // open GET event streams: { res, entry }
  let streamCounter = 0;
  let down = null; // an HTTP status every message gets, or null

  const notify = () => {
    for (const waiter of [...waiters]) {
      if (waiter.check()) {
        waiters.delete(waiter);
        waiter.resolve();
      }
    }
  };
  const record = (entry) => {
    log.push(entry);
    notify();
    return entry;
  };

  const markClosed = (entry, by) => {
    if (entry.closed) return;
    entry.closed = true;
    entry.closedAt = Date.now();
    entry.closedBy = by;
    notify();
  };
  /** Ends the open GET streams that `which` picks, from the server's side; how many. */
  const endStreams = (which = () => true, how = 'end') => {
    let ended = 0;
    for (const stream of [...streams]) {
      if (!which(stream)) continue;
      streams.delete(stream);
      markClosed(stream.entry, 'server');
      if (how === 'destroy') stream.res.destroy();
      else stream.res.end();
      ended += 1;
    }
    return ended;
  };
  /** Writes a notification on every open GET stream; how many were written. */
  const sendOnStreams = (payload) => {
    let written = 0;
    for (const { res, entry } of [...streams]) {
      if (res.writableEnded || res.destroyed) continue;
      res.write(`event: message\ndata: ${JSON.stringify(payload)}\n\n`);
      record({
        kind: 'sent',
        method: payload.method,
        ...(payload.params !== undefined ? { params: payload.params } : {}),
        session: entry.session,
        stream: entry.stream,
        headers: entry.headers,
      });
      written += 1;
    }
    return written;
  };
  const notifyListChanged = () => sendOnStreams({ jsonrpc: '2.0', method: 'notifications/tools/list_changed' });
  const setTools = (next, { notify: tell = true } = {}) => {
    tools = next;
    return tell ? notifyListChanged() : 0;
  };
  // What add_faq_tool publishes: added (or put in place of the tool of that
  // name), then list_changed on every open GET stream.
  state.publishTool = (tool) => {
    const next = tools.filter((t) => t.name !== tool.name);
    const at = tools.findIndex((t) => t.name === tool.name);
    next.splice(at < 0 ? next.length : at, 0, tool);
    return setTools(next);
  };
  /** Why the MCP-Protocol-Version header does not fit the session (null: it does). */
  const versionProblem = (session, headers) => {
    const sent = headers['mcp-protocol-version'];
    const bad = session.version === '2025-06-18' ? sent !== session.version : sent !== undefined && sent !== session.version;
    return bad ? `Bad MCP-Protocol-Version: ${sent ?? '(none)'}.` : null;
  };

  const reject = (res, entry, status, message, code = -32600) => {
    entry.status = status;
    entry.rejected = message;
    record(entry);
    if (res.headersSent) return;
    res.writeHead(status, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code, message } }));
  };

  async function handle(req, res) {
    const url = new URL(req.url, `http://${HOST}`);
    const headers = { ...req.headers };
    const entry = { kind: 'rejected', headers, status: 0, session: headers['mcp-session-id'] ?? null };
    if (req.method === 'GET') entry.method = 'GET';
    if (url.pathname !== '/mcp') return reject(res, entry, 404, `No MCP endpoint at ${url.pathname}.`);
    if (down !== null) return reject(res, entry, down, 'The server is down for maintenance.', -32000);
    if (req.method === 'GET') {
      // No server-initiated stream: allowed by the transport.
      if (!listChanged) return reject(res, entry, 405, 'This server offers no event stream at GET.');
      if (!String(headers.accept ?? '').includes('text/event-stream')) {
        return reject(res, entry, 406, 'Accept must list text/event-stream.');
      }
      if (!entry.session) return reject(res, entry, 400, 'Bad Request: no Mcp-Session-Id.');
      const session = sessions.get(entry.session);
      if (!session) return reject(res, entry, 404, 'Session not found.', -32001);
      const problem = versionProblem(session, headers);
      if (problem) return reject(res, entry, 400, problem);
      return openStream(res, entry);
    }
    if (req.method === 'DELETE') {
      sessions.delete(entry.session);
      endStreams((stream) => stream.entry.session === entry.session);
      entry.kind = 'delete';
      entry.status = 200;
      record(entry);
      res.writeHead(200);
      return res.end();
    }
    if (req.method !== 'POST') return reject(res, entry, 405, `${req.method} is not supported.`);
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const accept = String(headers.accept ?? '');
    if (!accept.includes('application/json') || !accept.includes('text/event-stream')) {
      return reject(res, entry, 406, 'Accept must list application/json and text/event-stream.');
    }
    if (!String(headers['content-type'] ?? '').startsWith('application/json')) {
      return reject(res, entry, 415, 'Content-Type must be application/json.');
    }
    let message;
    try {
      message = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      return reject(res, entry, 400, 'The body is not JSON.', -32700);
    }
    if (Array.isArray(message) || message?.jsonrpc !== '2.0') {
      return reject(res, entry, 400, 'One JSON-RPC 2.0 message per POST.');
    }
    entry.method = message.method;
    entry.id = message.id;
    entry.params = message.params;

    if (message.method === 'initialize') {
      entry.kind = 'request';
      const asked = message.params?.protocolVersion;
      const version = versions.includes(asked) ? asked : versions[0];
      sessionCounter += 1;
      const id = `session-${sessionCounter}-${Math.random().toString(36).slice(2)}`;
      const capabilities = message.params?.capabilities;
      sessions.set(id, { version, initialized: false, capabilities: capabilities && typeof capabilities === 'object' ? capabilities : {} });
      entry.status = 200;
      entry.session = id;
      entry.agreed = version;
      record(entry);
      res.writeHead(200, { 'Content-Type': 'application/json', 'Mcp-Session-Id': id });
      return res.end(JSON.stringify({
        jsonrpc: '2.0',
        id: message.id,
        result: {
          protocolVersion: version,
          capabilities: { tools: { listChanged } },
          serverInfo: { name: 'mock-mcp', version: '1.0.0' },
          instructions: 'Search before opening tickets.',
        },
      }));
    }

    const session = sessions.get(entry.session);
    if (!entry.session) return reject(res, entry, 400, 'Bad Request: no Mcp-Session-Id.');
    if (!session) return reject(res, entry, 404, 'Session not found.', -32001);
    const problem = versionProblem(session, headers);
    if (problem) return reject(res, entry, 400, problem);

    // A response to a request of ours, or a notification: 202, no body.
    if (message.method === undefined) {
      entry.kind = 'response';
      entry.result = message.result;
      entry.error = message.error;
      entry.status = 202;
      const asked = elicitationsAsked.get(message.id);
      if (asked || String(message.id).startsWith('elicit-')) {
        entry.kind = 'elicitation-response';
        entry.action = message.result?.action;
        entry.content = message.result?.content;
        entry.requestSession = asked?.session ?? null;
        entry.late = !askedByServer.has(message.id);
        if (asked) asked.answered = true;
      }
      record(entry);
      askedByServer.get(message.id)?.(message);
      askedByServer.delete(message.id);
      res.writeHead(202);
      return res.end();
    }
    if (message.id === undefined) {
      entry.kind = 'notification';
      entry.status = 202;
      if (message.method === 'notifications/initialized') session.initialized = true;
      if (message.method === 'notifications/cancelled') {
        running.get(`${entry.session} ${message.params?.requestId}`)?.abort(new Error('cancelled'));
      }
      record(entry);
      res.writeHead(202);
      return res.end();
    }

    entry.kind = 'request';
    if (message.method === 'ping') {
      // Allowed before notifications/initialized too.
      entry.status = 200;
      record(entry);
      return answerJson(res, { jsonrpc: '2.0', id: message.id, result: {} });
    }
    if (!session.initialized) return reject(res, entry, 400, 'The session is not initialized yet.');
    if (message.method === 'tools/list') {
      const start = message.params?.cursor === undefined ? 0 : Number(String(message.params.cursor).replace(/^page-/, ''));
      if (!Number.isInteger(start) || start < 0 || start > tools.length) {
        entry.status = 200;
        record(entry);
        return answerJson(res, { jsonrpc: '2.0', id: message.id, error: { code: -32602, message: 'Invalid cursor.' } });
      }
      const page = tools.slice(start, start + pageSize).map(({ run, answer, ...tool }) => tool);
      const next = start + pageSize < tools.length ? `page-${start + pageSize}` : undefined;
      entry.status = 200;
      record(entry);
      return answerJson(res, { jsonrpc: '2.0', id: message.id, result: { tools: page, ...(next ? { nextCursor: next } : {}) } });
    }
    if (message.method === 'tools/call') {
      const tool = tools.find((t) => t.name === message.params?.name);
      entry.status = 200;
      entry.tool = message.params?.name;
      entry.arguments = message.params?.arguments;
      entry.progressToken = message.params?._meta?.progressToken;
      record(entry);
      if (!tool) {
        return answerJson(res, { jsonrpc: '2.0', id: message.id, error: { code: -32602, message: `Unknown tool: ${message.params?.name}` } });
      }
      return callTool(req, res, entry, message, tool);
    }
    entry.status = 200;
    record(entry);
    return answerJson(res, { jsonrpc: '2.0', id: message.id, error: { code: -32601, message: `Method not found: ${message.method}` } });
  }

  // A GET event stream: open until the client closes it or the server ends
  // it (closeStreams, expireSessions, DELETE, reset, close).
  function openStream(res, entry) {
    streamCounter += 1;
    entry.kind = 'stream';
    entry.status = 200;
    entry.stream = streamCounter;
    entry.closed = false;
    const stream = { res, entry };
    streams.add(stream);
    res.on('close', () => {
      if (streams.delete(stream)) markClosed(entry, 'client');
    });
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    res.write(': open\n\n');
    record(entry);
  }

  function answerJson(res, body) {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.end(JSON.stringify(body));
  }

  async function callTool(req, res, entry, message, tool) {
    const mode = tool.answer ?? defaultAnswer;
    const controller = new AbortController();
    const key = `${entry.session} ${message.id}`;
    running.set(key, controller);
    let closed = false;
    res.on('close', () => {
      closed = true;
      if (!res.writableFinished) {
        entry.outcome ??= 'disconnected';
        controller.abort(new Error('disconnected'));
      }
      notify();
    });
    const send = (payload) => {
      if (closed || res.writableEnded || mode !== 'sse') return false;
      if (!res.headersSent) res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
      res.write(`event: message\ndata: ${JSON.stringify(payload)}\n\n`);
      return true;
    };
    const ctx = {
      signal: controller.signal,
      sleep: (ms) => sleep(ms, controller.signal),
      progress: (progress, total, text) => {
        const token = message.params?._meta?.progressToken;
        if (token === undefined) return;
        send({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: token, progress, ...(total !== undefined ? { total } : {}), ...(text ? { message: text } : {}) } });
      },
      notify: (method, params) => {
        const withParams = params !== undefined ? { params } : {};
        if (!send({ jsonrpc: '2.0', method, ...withParams })) return false;
        record({ kind: 'sent', method, ...withParams, session: entry.session, callId: message.id, headers: entry.headers });
        return true;
      },
      ask: (method, params) => {
        serverRequestCounter += 1;
        return askClient(`srv-${serverRequestCounter}`, method, params);
      },
      clientCapabilities: sessions.get(entry.session)?.capabilities ?? {},
      canElicit: Boolean(sessions.get(entry.session)?.capabilities?.elicitation),
      elicit: (text, requestedSchema) => {
        elicitationCounter += 1;
        const id = `elicit-${elicitationCounter}`;
        const params = { message: text, requestedSchema };
        const asked = {
          kind: 'elicitation',
          method: 'elicitation/create',
          id,
          params,
          callId: message.id,
          tool: entry.tool,
          headers: entry.headers,
          session: entry.session,
          status: 200,
          answered: false,
        };
        elicitationsAsked.set(id, asked);
        return askClient(id, 'elicitation/create', params, () => record(asked));
      },
    };
    // Sends a request of the server's on this call's stream and waits for
    // the client's answer (a POST of its own); stops waiting when the call
    // is cancelled or its stream closes.
    function askClient(id, method, params, onSent = () => {}) {
      return new Promise((resolve, rejectAsk) => {
        const stop = () => {
          askedByServer.delete(id);
          rejectAsk(controller.signal.reason ?? new Error('cancelled'));
        };
        if (controller.signal.aborted) return stop();
        controller.signal.addEventListener('abort', stop, { once: true });
        askedByServer.set(id, (answer) => {
          controller.signal.removeEventListener('abort', stop);
          resolve(answer);
        });
        if (!send({ jsonrpc: '2.0', id, method, params })) {
          askedByServer.delete(id);
          controller.signal.removeEventListener('abort', stop);
          resolve({ error: { code: 0, message: 'not sent: a JSON answer cannot carry requests' } });
          return;
        }
        onSent();
      });
    }
    if (mode === 'sse') res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    let result;
    try {
      result = await tool.run(message.params?.arguments ?? {}, ctx);
    } catch (error) {
      running.delete(key);
      entry.outcome = controller.signal.aborted ? (entry.outcome ?? 'cancelled') : 'threw';
      notify();
      if (closed) return;
      const body = { jsonrpc: '2.0', id: message.id, error: { code: -32603, message: String(error?.message ?? error) } };
      if (mode === 'sse') {
        send(body);
        return res.end();
      }
      return answerJson(res, body);
    }
    running.delete(key);
    entry.outcome = closed ? 'disconnected' : 'answered';
    entry.result = result;
    notify();
    if (closed) return;
    const body = { jsonrpc: '2.0', id: message.id, result };
    if (mode === 'sse') {
      send(body);
      return res.end();
    }
    return answerJson(res, body);
  }

  const server = http.createServer((req, res) => {
    handle(req, res).catch((error) => {
      if (!res.headersSent) res.writeHead(500, { 'Content-Type': 'text/plain' });
      res.end(String(error?.stack ?? error));
    });
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, HOST, resolve);
  });
  const { port } = server.address();
  const origin = `http://${HOST}:${port}`;

  return {
    url: `${origin}/mcp`,
    origin,
    state,
    /** Every message received, in order (see the header). */
    log: () => log.slice(),
    /** The tools/call requests received: { tool, arguments, progressToken, outcome, session, headers }. */
    calls: () => log.filter((e) => e.kind === 'request' && e.method === 'tools/call'),
    /** The notifications/cancelled received. */
    cancellations: () => log.filter((e) => e.method === 'notifications/cancelled'),
    /** The client's answers to requests of the server's (elicitation answers too). */
    responses: () => log.filter((e) => e.kind === 'response' || e.kind === 'elicitation-response'),
    /** The `elicitation/create` requests sent on calls' streams, in order. */
    elicitations: () => log.filter((e) => e.kind === 'elicitation'),
    /** The client's answers to them: { id, action, content, headers, session, requestSession, late }. */
    elicitationResponses: () => log.filter((e) => e.kind === 'elicitation-response'),
    /** The GET event streams opened: { stream, session, headers, closed, closedAt?, closedBy? }. */
    streams: () => log.filter((e) => e.kind === 'stream'),
    /** The notifications the server sent: on GET streams ({ stream }) and with ctx.notify ({ callId }). */
    sent: () => log.filter((e) => e.kind === 'sent'),
    tickets: () => state.tickets.slice(),
    bookings: () => state.bookings.slice(),
    /** The names of the tools the next tools/list lists. */
    toolNames: () => tools.map((t) => t.name),
    /** The next tools/list lists `next`; with notify (default), every open GET stream is told. → how many were. */
    setTools,
    /** `notifications/tools/list_changed` on every open GET stream, the tools unchanged. → how many got it. */
    notifyListChanged,
    /** Ends every open GET stream from the server's side. → how many. */
    closeStreams: () => endStreams(),
    /** How many GET streams are open (of `session`, if given). */
    streamCount: (session) => (session === undefined ? streams.size : [...streams].filter((s) => s.entry.session === session).length),
    /** Answer every message, GET included, with HTTP `status` (null: serve again). Open streams stay open. */
    setDown(status) {
      down = status;
    },
    /** Forget every session: the next message of each gets 404; their GET streams end. */
    expireSessions() {
      sessions.clear();
      endStreams();
    },
    sessionCount: () => sessions.size,
    /** Resolves when `check(log)` is true (checked on every message and call end). */
    waitFor(check, { timeout = 60000, message = 'the MCP server to see it' } = {}) {
      return new Promise((resolve, rejectWait) => {
        if (check(log)) return resolve();
        const timer = setTimeout(() => {
          if (waiters.delete(waiter)) rejectWait(new Error(`timed out waiting for ${message}; log: ${JSON.stringify(log.map((e) => [e.kind, e.method, e.tool, e.status, e.outcome]))}`));
        }, timeout);
        const waiter = {
          check: () => check(log),
          resolve: () => {
            clearTimeout(timer);
            resolve();
          },
        };
        waiters.add(waiter);
      });
    },
    reset() {
      endStreams();
      log = [];
      state.tickets.length = 0;
      state.bookings.length = 0;
      elicitationsAsked.clear();
      sessions.clear();
      down = null;
      for (const controller of running.values()) controller.abort(new Error('reset'));
      running.clear();
      if (!options.tools) tools = demoTools(state);
    },
    async close() {
      endStreams(() => true, 'destroy');
      for (const controller of running.values()) controller.abort(new Error('closing'));
      server.closeAllConnections?.();
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

function parseArgs(argv) {
  const args = { port: 0 };
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === '--port') args.port = Number(argv[++i]);
    else if (argv[i] === '--help' || argv[i] === '-h') {
      process.stdout.write('usage: node tests/mock-mcp/server.mjs [--port N]\n');
      process.exit(0);
    } else {
      process.stderr.write(`mock-mcp: unknown argument ${argv[i]}\n`);
      process.exit(2);
    }
  }
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) {
    process.stderr.write('mock-mcp: --port must be an integer 0..65535\n');
    process.exit(2);
  }
  return args;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const args = parseArgs(process.argv.slice(2));
  const mock = await startMockMcp({ port: args.port });
  process.stdout.write(`MOCK_MCP_URL=${mock.url}\n`);
  const stop = async () => {
    await mock.close();
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
