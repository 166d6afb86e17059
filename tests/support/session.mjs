// One end-to-end session: the mock LLM, the static test-page server, Chromium
// with the built extension, the test page tab and the side panel tab, with the
// provider configured through the panel's settings UI. Shared by the e2e suite
// and the demo.
//
// Must not: leave servers or browsers running after close(), or use fixed
// sleeps (everything waits on a condition).

import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { startMockLlm } from '../mock-llm/server.mjs';
import { startStaticServer } from './static-server.mjs';
import {
  REPO_ROOT,
  launchWithExtension,
  openPanel,
  configureProvider,
  readPanel,
  transcriptLines,
  waitFor,
  portLog,
} from './browser.mjs';

export const TEST_API_KEY = 'sk-test-SECRET-123';
export const TEST_MODEL = 'mock-1';

/** Run states after which a run does nothing more by itself. */
export const SETTLED_STATES = ['completed', 'failed', 'interrupted', 'budget_paused', 'paused_uncertain'];

/**
 * Starts everything and returns handles. The shop page is the active tab when
 * this resolves (the panel tab stays open in the background and is driven
 * from there), so "the active tab" the engine acts on is the test page.
 * `launch` goes to launchWithExtension (e.g. `{ extraArgs }`); a function
 * `(session) => options` is called once the mock LLM and the page server
 * run (e.g. to write an extension that names the mock's address).
 * `configure: false` leaves the panel's settings untouched.
 */
export async function startSession({ script = null, apiKey = TEST_API_KEY, model = TEST_MODEL, page = 'shop.html', launch = {}, provider = 'openai', configure = true } = {}) {
  const closers = [];
  const session = { closers };
  try {
    session.mock = await startMockLlm({ quiet: true });
    closers.push(() => session.mock.close());
    if (script) session.mock.setScript(script);
    session.pages = await startStaticServer();
    closers.push(() => session.pages.close());
    session.browser = await launchWithExtension(typeof launch === 'function' ? await launch(session) : launch);
    closers.push(() => session.browser.close());
    session.context = session.browser.context;
    session.extensionId = session.browser.extensionId;

    session.shop = session.context.pages()[0] ?? (await session.context.newPage());
    await session.shop.goto(session.pages.url(page));
    session.panel = await openPanel(session.context, session.extensionId);
    if (configure) await configureProvider(session.panel, { provider, baseUrl: session.mock.url, model, apiKey });
    // The panel opened as a tab is the active tab now; the task is about the page.
    await session.shop.bringToFront();
  } catch (error) {
    const written = await saveArtifacts(session, 'session-startup', error);
    if (written.length) process.stderr.write(`session: startup failed; artifacts: ${written.join(', ')}\n`);
    await closeAll(closers);
    throw error;
  }
  session.close = () => closeAll(closers);
  return session;
}

async function closeAll(closers) {
  for (const close of closers.splice(0).reverse()) {
    try {
      await close();
    } catch {
      // best effort: one failing close must not keep the others open
    }
  }
}

/**
 * Registers a node:test test with its own fresh session (browser, profile,
 * servers); artifacts are saved when it fails (and always with
 * E2E_ARTIFACTS=always). `test` is node:test's, passed in so this module
 * stays importable by the demo.
 */
export function isolatedTest(test, name, options, body, { timeout = 300000 } = {}) {
  test(name, { timeout }, async () => {
    let session = null;
    try {
      session = await startSession(options);
      await body(session);
      if (process.env.E2E_ARTIFACTS === 'always') await saveArtifacts(session, name, 'passed (E2E_ARTIFACTS=always)');
    } catch (error) {
      const written = await saveArtifacts(session, name, error);
      if (written.length) process.stderr.write(`e2e: ${name} failed; artifacts: ${written.join(', ')}\n`);
      throw error;
    } finally {
      if (session) await session.close();
    }
  });
}

/** The page's Subscribe click counter (body[data-subscribe-clicks]). */
export async function subscribeClicks(shop) {
  return Number(await shop.evaluate(() => document.body.dataset.subscribeClicks ?? window.subscribeClicks ?? 0));
}

/**
 * Waits until the panel shows a settled run state for a turn other than
 * `previousTurnId`, and returns the panel state.
 */
export async function waitForSettledTurn(panel, { previousTurnId = '', timeout = 180000, states = SETTLED_STATES } = {}) {
  return waitFor(
    async () => {
      const state = await readPanel(panel);
      return states.includes(state.state) && state.turnId && state.turnId !== previousTurnId ? state : null;
    },
    { timeout, interval: 200, message: `the run to settle (${states.join('|')})` },
  );
}

/**
 * A seeded schedule for the randomized e2e tests (xorshift32): a function
 * returning numbers in [0, 1), the same sequence for the same seed.
 */
export function seededRandom(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x / 2 ** 32;
  };
}

/** Top-level (not nested) rendered nodes. */
export function topLevelNodes(panelState) {
  return panelState.nodes.filter((node) => !node.parentNodeId);
}

/** tool_call cards with the tool_result nodes rendered inside them. */
export function toolCards(panelState) {
  return panelState.nodes
    .filter((node) => node.kind === 'tool_call')
    .map((card) => ({
      ...card,
      results: panelState.nodes.filter((node) => node.kind === 'tool_result' && node.parentNodeId === card.nodeId),
    }));
}

/**
 * Checks, on what the provider actually received, that every tool call of an
 * assistant message has exactly one tool result before the next provider
 * request (invariant no_orphan_tool_calls), and that no tool-call id repeats
 * across assistant messages. Returns a list of problems (empty when fine).
 */
export function orphanToolCallProblems(requests) {
  const problems = [];
  for (const request of requests) {
    const messages = Array.isArray(request.body?.messages) ? request.body.messages : [];
    if (request.format === 'anthropic') {
      problems.push(...anthropicOrphans(request.index, messages));
      continue;
    }
    const seenIds = new Set();
    for (let i = 0; i < messages.length; i += 1) {
      const message = messages[i];
      if (message.role !== 'assistant' || !Array.isArray(message.tool_calls)) continue;
      for (const call of message.tool_calls) {
        if (seenIds.has(call.id)) problems.push(`request #${request.index}: tool call id ${call.id} appears twice`);
        seenIds.add(call.id);
        const results = messages.filter((m) => m.role === 'tool' && m.tool_call_id === call.id);
        if (results.length !== 1) {
          problems.push(`request #${request.index}: tool call ${call.id} (${call.function?.name}) has ${results.length} results`);
        }
      }
    }
  }
  return problems;
}

/**
 * The same rule in the Messages format: every `tool_use` block of an
 * assistant message is answered by exactly one `tool_result` block in the
 * user message right after it (the API refuses anything else), and no
 * result answers a call that is not there.
 */
function anthropicOrphans(index, messages) {
  const problems = [];
  const blocks = (message, type) => (Array.isArray(message?.content) ? message.content.filter((b) => b?.type === type) : []);
  const seenIds = new Set();
  for (let i = 0; i < messages.length; i += 1) {
    const calls = messages[i].role === 'assistant' ? blocks(messages[i], 'tool_use') : [];
    const next = messages[i + 1];
    const results = next?.role === 'user' ? blocks(next, 'tool_result') : [];
    for (const call of calls) {
      if (seenIds.has(call.id)) problems.push(`request #${index}: tool_use id ${call.id} appears twice`);
      seenIds.add(call.id);
      const answers = results.filter((r) => r.tool_use_id === call.id).length;
      if (answers !== 1) problems.push(`request #${index}: tool_use ${call.id} (${call.name}) has ${answers} results in the next message`);
    }
    if (messages[i].role === 'user') {
      const before = i > 0 && messages[i - 1].role === 'assistant' ? blocks(messages[i - 1], 'tool_use').map((c) => c.id) : [];
      for (const result of blocks(messages[i], 'tool_result')) {
        if (!before.includes(result.tool_use_id)) problems.push(`request #${index}: tool_result ${result.tool_use_id} answers no call just made`);
      }
    }
  }
  return problems;
}

/**
 * Writes failure artifacts to target/e2e/<slug>.*: a screenshot of the panel,
 * the transcript and panel state, the mock's requests, the browser console
 * and the panel's Port log. Never throws.
 */
export async function saveArtifacts(session, slug, error) {
  const dir = path.join(REPO_ROOT, 'target', 'e2e');
  const base = path.join(dir, slug);
  const written = [];
  try {
    mkdirSync(dir, { recursive: true });
  } catch {
    return written;
  }
  const attempt = async (label, fn) => {
    try {
      await fn();
    } catch (artifactError) {
      written.push(`${label}: failed (${artifactError.message})`);
    }
  };
  const report = [`test: ${slug}`, `error: ${error?.stack ?? error}`, ''];
  if (session?.panel) {
    await attempt('screenshot', async () => {
      await session.panel.screenshot({ path: `${base}.png`, fullPage: true });
      written.push(`${base}.png`);
    });
    await attempt('panel', async () => {
      const state = await readPanel(session.panel);
      report.push(`panel: state=${state.state} turnId=${state.turnId} connected=${state.connected} epoch=${state.epoch}`);
      if (state.error) report.push(`error banner: ${state.error}`);
      report.push('transcript:', ...transcriptLines(state), '');
    });
    await attempt('ports', async () => {
      const log = (await portLog(session.panel)) ?? [];
      report.push(`port log (${log.length} entries, last 80):`);
      for (const entry of log.slice(-80)) report.push(`  ${entry.dir} #${entry.connection} ${entry.json ?? ''}`.slice(0, 400));
      report.push('');
    });
  }
  if (session?.shop) {
    await attempt('page', async () => {
      report.push(`page: ${session.shop.url()} subscribeClicks=${await subscribeClicks(session.shop)}`, '');
    });
  }
  if (session?.mock) {
    report.push('mock requests:');
    for (const request of session.mock.requests()) {
      const messages = request.body?.messages ?? [];
      report.push(
        `  #${request.index} source=${request.source} outcome=${request.outcome} messages=${messages.length} last=${JSON.stringify(messages.at(-1) ?? null).slice(0, 300)}`,
      );
    }
    report.push('');
  }
  if (session?.browser) {
    report.push('browser console (last 100):');
    for (const entry of session.browser.consoleLog.slice(-100)) report.push(`  [${entry.type}] ${entry.source}: ${entry.text}`.slice(0, 600));
  }
  await attempt('report', async () => {
    writeFileSync(`${base}.txt`, `${report.join('\n')}\n`);
    written.push(`${base}.txt`);
  });
  return written;
}

/** Text of a message's content as the mock recorded it (a string or an array of parts). */
export function messageText(message) {
  const content = message?.content;
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((part) => (typeof part === 'string' ? part : part?.text ?? '')).join('');
  return '';
}

/** Tool results of a recorded OpenAI-format request, by tool name (the last of each name). */
export function resultsByTool(request) {
  const messages = request.body?.messages ?? [];
  const out = {};
  for (const message of messages) {
    if (message.role !== 'assistant' || !Array.isArray(message.tool_calls)) continue;
    for (const toolCall of message.tool_calls) {
      const result = messages.find((m) => m.role === 'tool' && m.tool_call_id === toolCall.id);
      out[toolCall.function?.name] = result ? messageText(result) : null;
    }
  }
  return out;
}

/**
 * Source for the top of a module the worker imports (an extension file a
 * test writes): it keeps the worker's console errors in
 * `globalThis.__consoleErrors`, once per worker, for the test to read.
 */
export const RECORD_CONSOLE_ERRORS = `
const errors = (globalThis.__consoleErrors ??= []);
if (typeof document === 'undefined' && !globalThis.__consoleWrapped) {
  globalThis.__consoleWrapped = true;
  const consoleError = console.error.bind(console);
  console.error = (...args) => {
    errors.push(args.map(String).join(' '));
    consoleError(...args);
  };
}
`;

/** Replaces the mock LLM's queue of responses through its HTTP control API (POST /__control/script). */
export async function scriptModel(mock, steps) {
  const response = await fetch(`${mock.origin}/__control/script`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ steps }),
  });
  const body = await response.text();
  if (response.status !== 200) throw new Error(`POST /__control/script: ${response.status} ${body}`);
  const pending = JSON.parse(body).pendingSteps;
  if (pending !== steps.length) throw new Error(`POST /__control/script: ${pending} steps pending, ${steps.length} sent`);
}

/** Evaluates `fn(arg)` in the extension's worker once its engine is ready (a restarted worker included). */
export async function inEngineWorker(session, fn, arg) {
  const prefix = `chrome-extension://${session.extensionId}/`;
  return waitFor(
    async () => {
      for (const worker of session.context.serviceWorkers().filter((w) => w.url().startsWith(prefix)).reverse()) {
        try {
          const ready = await worker.evaluate(() => Boolean(globalThis.__swAgent?.engine));
          if (ready) return { value: await worker.evaluate(fn, arg) };
        } catch {
          // a worker that was just killed: look again
        }
      }
      return null;
    },
    { timeout: 60000, message: 'the engine of a running worker' },
  ).then((found) => found.value);
}

/** Ticks "Model sees images" in the panel's settings and saves. */
export async function enableVision(panel) {
  await panel.click('#settings-toggle');
  await panel.locator('#settings-vision').waitFor({ state: 'visible', timeout: 15000 });
  await panel.locator('#settings-vision').setChecked(true);
  await panel.click('#settings-save');
  await waitFor(async () => /saved/i.test((await panel.locator('#settings-status').textContent()) ?? ''), { timeout: 15000, message: 'Saved' });
  await panel.click('#settings-toggle');
  const stored = await panel.evaluate(async () => (await chrome.storage.local.get('settings')).settings);
  if (stored?.vision !== true) throw new Error(`enableVision: stored settings.vision is ${JSON.stringify(stored?.vision)}`);
}

/**
 * Lets the test rewrite what the panel posts on its Port (init script, so it
 * wraps the Port the panel opens): `window.__rewriteOp = (op) => op`.
 */
export function opRewriterInitScript() {
  if (location.protocol !== 'chrome-extension:') return;
  const runtime = globalThis.chrome && globalThis.chrome.runtime;
  if (!runtime || typeof runtime.connect !== 'function' || globalThis.__opRewriterInstalled) return;
  globalThis.__opRewriterInstalled = true;
  const connect = runtime.connect.bind(runtime);
  runtime.connect = (...args) => {
    const port = connect(...args);
    const post = port.postMessage.bind(port);
    port.postMessage = (message) => post(typeof globalThis.__rewriteOp === 'function' ? globalThis.__rewriteOp(message) : message);
    return port;
  };
}
