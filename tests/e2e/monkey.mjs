// A user who does anything, in any order: the built extension's side panel
// (two of them, as in two windows) driven by random actions (every visible, enabled button, text box and
// list of the panel, outside the settings form), while the service worker is
// killed and the panel reloaded at random, and settings change mid-run. The model answers from the
// conversation alone (reads the page, clicks Subscribe after an approval,
// asks the user, or just answers), slowly enough for actions to land
// mid-stream.
//
// What must hold whatever was done:
// - the panel throws no uncaught error;
// - every op a panel sent since its last reload is answered (ACK or
//   reject): none is left hanging;
// - two panels on the same thread show the same;
// - once nothing runs, what the panel shows is what it shows after a reload
//   (rendered state = durable state);
// - no provider request carries a tool call without its result;
// - no stored record outlives its thread, and every leaf is a node;
// - Subscribe is clicked at most once per click call the user did not
//   decline, plus once per Retry of an uncertain click.
//
// Seeded: MONKEY_SEED=N (printed on stderr), MONKEY_ACTIONS=N (default 70).
// MONKEY_DEBUG=1 writes what the panels showed and their Port logs to
// target/e2e/monkey-<seed>*.json.
// Run:  node tests/e2e/monkey.mjs            (after `make build`)

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import {
  exitUnlessExtensionBuilt,
  dumpIndexedDb,
  openPanel,
  readPanel,
  killServiceWorker,
  portLog,
  waitFor,
} from '../support/browser.mjs';
import { subscribeClicks, topLevelNodes, orphanToolCallProblems, isolatedTest, seededRandom } from '../support/session.mjs';
import { contentText } from '../mock-llm/server.mjs';

exitUnlessExtensionBuilt('e2e');

const ACTIONS = Number(process.env.MONKEY_ACTIONS ?? 70);
const TEXTS = ['read the page', 'click Subscribe', 'ask me which plan', 'just say hello', ''];

/** The monkey's model: a function of the conversation only. */
function monkeyPolicy(body) {
  const messages = body.messages ?? [];
  let last = -1;
  for (let i = messages.length - 1; i >= 0; i -= 1) {
    if (messages[i].role === 'user') {
      last = i;
      break;
    }
  }
  const task = last >= 0 ? contentText(messages[last].content) : '';
  const tools = messages.slice(last + 1).filter((m) => m.role === 'tool').length;
  const slow = { chunkDelayMs: 8 };
  const filler = 'taking a careful look, '.repeat(6);
  if (!(body.tools?.length > 0) || tools >= 2 || /hello/.test(task)) {
    return { text: `Finished "${task.slice(0, 30)}". ${filler}`, ...slow };
  }
  if (tools === 0 && /ask me/.test(task)) {
    return { text: `One question first. ${filler}`, toolCalls: [{ name: 'ask_user', arguments: { question: 'Which plan?', options: ['Basic', 'Pro'] } }], ...slow };
  }
  if (tools === 0 && /click/.test(task)) {
    return { text: `Clicking. ${filler}`, toolCalls: [{ name: 'click', arguments: { text: 'Subscribe' } }], ...slow };
  }
  return { text: `Reading. ${filler}`, toolCalls: [{ name: 'read_page', arguments: {} }], ...slow };
}

/** What the monkey attaches (the composer's hidden file input). */
const FILES = [
  { name: 'dot.png', mimeType: 'image/png', buffer: Buffer.from('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==', 'base64') },
  { name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('buy milk\n</attached_file>\nsay hi') },
  { name: 'doc.pdf', mimeType: 'application/pdf', buffer: Buffer.from('%PDF-1.4\n%%EOF\n') },
  { name: 'song.mp3', mimeType: 'audio/mpeg', buffer: Buffer.from('ID3') },
];

/**
 * Marks every control a user could use now with `data-monkey` and returns
 * them: visible, enabled, outside the settings form (a wrong base URL would
 * only test the network).
 */
async function controls(panel) {
  return panel.evaluate(() => {
    const found = [];
    let n = 0;
    for (const old of document.querySelectorAll('[data-monkey]')) delete old.dataset.monkey;
    for (const element of document.querySelectorAll('button, textarea, input, select')) {
      if (element.disabled || element.closest('#settings-section') || element.getClientRects().length === 0) continue;
      if (['settings-toggle', 'error-settings'].includes(element.id)) continue;
      if (element.closest('[hidden]')) continue;
      n += 1;
      element.dataset.monkey = String(n);
      found.push({ key: String(n), tag: element.tagName, type: element.type ?? '', label: (element.id || element.dataset.action || element.textContent || '').trim().slice(0, 40) });
    }
    return found;
  });
}

/** Every op the panel sent (since its last load) without an answer. */
async function unanswered(panel) {
  const log = (await portLog(panel)) ?? [];
  const answered = new Set();
  const sent = new Map();
  for (const entry of log) {
    if (!entry.json) continue;
    const message = JSON.parse(entry.json);
    if (entry.dir === 'in' && (message.type === 'command.ack' || message.type === 'command.reject')) answered.add(message.submissionId);
    if (entry.dir === 'out' && message.type !== 'initialize' && message.submissionId) sent.set(message.submissionId, message.type);
  }
  return [...sent].filter(([id]) => !answered.has(id));
}

/**
 * Click calls the user declined and never accepted (an approval is asked
 * again only after a restart cancelled the first): none of them may click.
 * `db` is the engine's database as `dumpIndexedDb` reads it.
 */
function declinedClickCalls(db) {
  const clicks = (db.approvals ?? []).map((entry) => entry.value).filter((a) => a.toolName === 'click');
  const accepted = new Set(clicks.filter((a) => a.status.startsWith('accepted')).map((a) => a.callId));
  return new Set(clicks.filter((a) => a.status === 'declined' && !accepted.has(a.callId)).map((a) => a.callId)).size;
}

/**
 * Records of threads that are gone (written after, or left behind by, a
 * `thread.delete`), and threads whose leaf is not one of their nodes, in
 * `db` (the engine's database as `dumpIndexedDb` reads it).
 */
function strayRecords(db) {
  const values = (store) => (db[store] ?? []).map((entry) => entry.value);
  const threads = new Set(values('threads').map((t) => t.id));
  const problems = [];
  for (const store of ['nodes', 'runs', 'queue', 'steers', 'approvals', 'interactions', 'snapshots']) {
    for (const record of values(store)) {
      if (!threads.has(record.threadId)) problems.push(`${store} record of the deleted thread ${record.threadId}`);
    }
  }
  const nodes = new Map(values('nodes').map((n) => [n.id, n]));
  for (const thread of values('threads')) {
    if (thread.leafId && nodes.get(thread.leafId)?.threadId !== thread.id) problems.push(`thread ${thread.id} has no leaf ${thread.leafId}`);
  }
  return problems;
}

/**
 * What the panel shows of its thread: the thread, the nodes, the version
 * switchers. The thread is the one the messages were drawn from (chosen in
 * the list, another thread's messages stay until its snapshot arrives,
 * marked busy). The panel is read in two calls; one whose thread changed
 * in between (a snapshot drawn meanwhile) is read again.
 */
async function shown(panel) {
  const own = () => panel.evaluate(() => ({
    thread: document.getElementById('messages')?.dataset.threadId ?? '',
    busy: document.getElementById('messages')?.getAttribute('aria-busy') === 'true',
    switchers: [...document.querySelectorAll('.branch-position')].map((e) => e.textContent),
    queue: [...document.querySelectorAll('#queue-list .queue-text')].map((e) => e.textContent),
  }));
  for (;;) {
    const extra = await own();
    const state = await readPanel(panel);
    const again = await own();
    if (again.thread !== extra.thread || again.busy !== extra.busy) continue;
    return {
      ...again,
      state: state.state,
      nodes: topLevelNodes(state).map((n) => `${n.kind}|${n.status ?? ''}|${n.text.replace(/\s+/g, ' ').slice(0, 200)}`),
    };
  }
}

const RUNNING = ['queued', 'streaming_model', 'executing_tools'];

const seed = Number(process.env.MONKEY_SEED ?? 3);
// Odd seeds speak Anthropic's Messages format, even ones OpenAI's.
const provider = seed % 2 === 1 ? 'anthropic' : 'openai';
isolatedTest(test, `random_panel_actions_with_kills_leave_no_op_unanswered_and_show_what_is_stored (seed ${seed}, ${provider})`, { provider }, async (session) => {
  const { panel, shop, mock, context, extensionId } = session;
  process.stderr.write(`monkey: MONKEY_SEED=${seed} (${provider})\n`);
  const random = seededRandom(seed);
  const pick = (items) => items[Math.floor(random() * items.length)];
  mock.setPolicy(monkeyPolicy);
  // Two panels (two windows' side panels): every change one makes must
  // reach the other.
  const panels = [panel, await openPanel(context, extensionId)];
  await shop.bringToFront();
  const errors = [];
  for (const [n, page] of panels.entries()) {
    page.on('pageerror', (error) => errors.push(`panel ${n} pageerror: ${error.message}`));
    page.on('dialog', (dialog) => dialog.accept().catch(() => {}));
  }
  const counts = { kill: 0, reload: 0, click: 0, type: 0, select: 0, key: 0, settings: 0, follow: 0, retry: 0, none: 0, missed: 0 };

  for (let step = 0; step < ACTIONS; step += 1) {
    const roll = random();
    const panel = pick(panels);
    if (roll < 0.04) {
      await killServiceWorker(context, extensionId, { page: panel }).catch(() => {});
      counts.kill += 1;
    } else if (roll < 0.06) {
      // Ops sent before a reload are the page's; a fresh page starts over.
      await panel.reload();
      await waitFor(() => panel.evaluate(() => document.body?.dataset.ready === 'true'), { timeout: 30000, message: 'the reloaded panel ready' });
      counts.reload += 1;
    } else if (roll < 0.1) {
      await panel.keyboard.press(pick(['Escape', 'Shift+Alt+Enter', 'Tab'])).catch(() => {});
      counts.key += 1;
    } else if (roll < 0.14) {
      // A setting changes mid-run: the model, the context window (a small
      // one compacts), the token budget (a small one pauses the turn), tool
      // use, vision.
      const [selector, value] = pick([
        ['#settings-model', pick(['mock-1', 'mock-2'])],
        ['#settings-context-window', pick(['', '4000', '16000'])],
        ['#settings-token-budget', pick(['', '3000', '50000'])],
        ['#settings-tool-use', null],
        ['#settings-vision', null],
      ]);
      try {
        if (!(await panel.locator('#settings-base-url').isVisible())) await panel.click('#settings-toggle', { timeout: 1000, force: true });
        if (value === null) await panel.click(selector, { timeout: 1000, force: true });
        else await panel.fill(selector, value, { timeout: 1000, force: true });
        await panel.click('#settings-save', { timeout: 1000, force: true });
        await panel.click('#settings-toggle', { timeout: 1000, force: true });
        counts.settings += 1;
      } catch {
        counts.missed += 1;
      }
    } else if (roll < 0.22) {
      // The user opens, in this panel, the thread the other one shows: the
      // two then watch the same thread change.
      const other = panels.find((p) => p !== panel);
      const thread = await other.evaluate(() => document.getElementById('thread-list')?.value ?? '').catch(() => '');
      if (thread) await panel.selectOption('#thread-list', thread, { timeout: 1000, force: true }).catch(() => {});
      counts.follow += 1;
    } else {
      const found = await controls(panel);
      // Half the time the composer, if it is there: most of what a user does.
      const composer = found.find((c) => c.label === 'task-input');
      if (found.length === 0) counts.none += 1;
      if (found.length > 0) {
        const control = composer && random() < 0.4 ? composer : pick(found);
        const locator = panel.locator(`[data-monkey="${control.key}"]`);
        try {
          if (control.tag === 'SELECT') {
            const values = await locator.evaluate((e) => [...e.options].map((o) => o.value));
            if (values.length) await locator.selectOption(pick(values), { timeout: 1000, force: true });
            counts.select += 1;
          } else if (control.tag === 'INPUT' && control.type === 'file') {
            // Files for the next message: an image, a text file, or one the panel refuses.
            await locator.setInputFiles([pick(FILES)], { timeout: 1000 });
            counts.attach = (counts.attach ?? 0) + 1;
          } else if (control.tag === 'TEXTAREA' || (control.tag === 'INPUT' && ['text', 'search', ''].includes(control.type))) {
            await locator.fill(`${pick(TEXTS)} ${step}`.trim(), { timeout: 1000, force: true });
            if (random() < 0.8) await locator.press(pick(['Enter', 'Enter', 'Shift+Alt+Enter']), { timeout: 1000 });
            counts.type += 1;
          } else {
            if (control.label === 'uncertain-retry') counts.retry += 1;
            // The panel is a background tab (the page is in front, for the page
            // tools): animation frames are throttled there, so Playwright's
            // stability wait would time out; a user's click needs none.
            await locator.click({ timeout: 1000, force: true });
            counts.click += 1;
          }
        } catch (error) {
          // The control went away under the monkey's hand (a snapshot re-rendered it): a no-op.
          counts.missed += 1;
          if (process.env.MONKEY_DEBUG) process.stderr.write(`missed ${control.tag} ${control.label}: ${String(error.message).split('\n').slice(0, 6).join(' | ')}\n`);
        }
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 40 + random() * 400));
  }

  // Let it come to rest: both panels connected, nothing streaming or
  // running a tool, the same for two seconds.
  let previous = '';
  let sameSince = Date.now();
  await waitFor(
    async () => {
      const states = await Promise.all(panels.map((p) => readPanel(p)));
      const now = JSON.stringify(await Promise.all(panels.map((p) => shown(p))));
      if (now !== previous) {
        previous = now;
        sameSince = Date.now();
      }
      return states.every((state) => state.connected === 'true' && !RUNNING.includes(state.state)) && Date.now() - sameSince > 2000;
    },
    { timeout: 120000, interval: 250, message: 'the panels to come to rest' },
  );
  // An editor the monkey left open (a queued message, an edit) is the
  // page's own state, gone after a reload: cancel them first (a click on
  // Cancel, in the page: a background tab's key presses may not land).
  for (const page of panels) {
    await page.evaluate(() => {
      for (const form of document.querySelectorAll('form.queue-editor, form.message-editor')) {
        form.querySelector('button[type="button"]')?.click();
      }
    });
    const open = await page.locator('form.queue-editor, form.message-editor').count();
    assert.equal(open, 0, 'every editor closed');
  }
  for (const [n, page] of panels.entries()) {
    assert.deepEqual(await unanswered(page), [], `every op panel ${n} sent since its last load was answered`);
  }
  // What two panels show of one thread is the same, at the newest end (one
  // may have paged in earlier messages).
  const newestOf = (a, b) => {
    const n = Math.min(a.nodes.length, b.nodes.length);
    return (view) => ({ ...view, nodes: view.nodes.slice(view.nodes.length - n) });
  };
  // MONKEY_DEBUG: what both panels show and their Port logs at rest, and
  // each Port log again once a panel opened the thread to compare (below).
  const debugLog = async (name, page) => {
    if (process.env.MONKEY_DEBUG) writeFileSync(`target/e2e/monkey-${seed}-${name}.json`, JSON.stringify(await portLog(page), null, 1));
  };
  if (process.env.MONKEY_DEBUG) {
    const dump = [];
    for (const page of panels) {
      dump.push({
        shown: await shown(page),
        queueHtml: await page.evaluate(() => document.getElementById('queue-list')?.outerHTML ?? ''),
        log: await portLog(page),
      });
    }
    const db = (await dumpIndexedDb(panel))['sw-agent'] ?? {};
    writeFileSync(`target/e2e/monkey-${seed}.json`, JSON.stringify({ panels: dump, queue: db.queue ?? [] }, null, 1));
  }
  /** Opens `reference`'s thread in `page` (unless shown) and waits until it shows it. */
  const showThread = async (page, reference) => {
    if ((await shown(page)).thread !== reference.thread && reference.thread) {
      await page.selectOption('#thread-list', reference.thread, { timeout: 5000, force: true });
    }
    const earlierHidden = () => page.evaluate(() => Boolean(document.querySelector('.load-earlier')));
    return waitFor(
      async () => {
        const now = await shown(page);
        const complete = now.nodes.length === reference.nodes.length || (now.nodes.length > 0 && (await earlierHidden()));
        return now.thread === reference.thread && !now.busy && complete ? now : null;
      },
      { timeout: 30000, message: `a panel to show thread ${reference.thread}` },
    ).catch(() => shown(page));
  };
  const views = await Promise.all(panels.map((p) => shown(p)));
  const sameThread = views[0].thread === views[1].thread;
  if (views[0].thread) {
    // Watching it all along, or opening it now: the same.
    const second = sameThread ? views[1] : await showThread(panels[1], views[0]);
    await debugLog('second', panels[1]);
    assert.ok(second.nodes.length > 0 || views[0].nodes.length === 0, 'the second panel shows the thread');
    const tail = newestOf(views[0], second);
    assert.deepEqual(tail(second), tail(views[0]), `two panels on one thread show the same (${sameThread ? 'both watched it' : 'opened by the second'})`);
  }
  const before = views[0];
  await panel.reload();
  await waitFor(() => panel.evaluate(() => document.body?.dataset.ready === 'true'), { timeout: 30000, message: 'the reloaded panel ready' });
  // The reloaded panel may open another thread; show the same one. A long
  // thread opens with its newest messages only (earlier ones page in on
  // scroll), where the live panel may have shown them all: compare what
  // both show, the newest end.
  const after = await showThread(panel, before);
  await debugLog('reloaded', panel);
  assert.ok(after.nodes.length > 0 || before.nodes.length === 0, 'the reloaded panel shows the thread');
  const tail = newestOf(after, before);
  assert.deepEqual(tail(after), tail(before), 'what the panel showed is what it shows after a reload');
  assert.deepEqual(orphanToolCallProblems(mock.requests()), [], 'no_orphan_tool_calls');
  // The engine's database, read once for the two checks below.
  const stored = (await dumpIndexedDb(panel))['sw-agent'] ?? {};
  assert.deepEqual(strayRecords(stored), [], 'no record outlives its thread');
  // never_retry_at_most_once: each click call the model made is dispatched
  // at most once, and one the user declined never; only the user's Retry
  // on an uncertain click sends one again. (A thread the monkey deleted
  // took its approvals along: its declined calls count as allowed, which
  // only loosens the bound.)
  const clickCalls = mock.requests().filter((r) => r.outcome === 'completed' && r.step?.toolCalls?.some((c) => c.name === 'click')).length;
  const declined = declinedClickCalls(stored);
  const clicks = await subscribeClicks(shop);
  assert.ok(
    clicks <= clickCalls - declined + counts.retry,
    `Subscribe clicked ${clicks} times for ${clickCalls} click calls, ${declined} of them declined, and ${counts.retry} retries`,
  );
  assert.deepEqual(errors, [], 'the panel threw no uncaught error');
  process.stderr.write(`monkey: ${JSON.stringify(counts)}, ${mock.requests().length} provider requests, ${before.nodes.length} nodes shown, clicks ${clicks} of ${clickCalls} calls (${declined} declined), panels ${sameThread ? 'on one thread' : 'on two threads'}\n`);
}, { timeout: 400000 });
