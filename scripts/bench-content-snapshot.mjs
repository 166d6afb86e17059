// The page-tool content script's cost on a large page: page_snapshot and
// read_page timed for several copies of extension/content/content.js side
// by side, interleaved, in one browser.
//
// Usage: node scripts/bench-content-snapshot.mjs [--reps N] [--warmup N]
//          [--controls N] [--scenarios closed,open,none,sparse,plain]
//          [--versions name=REV,name=REV,...]
//   --versions  the copies to compare, each a git revision whose
//               extension/content/content.js is taken, "." for the work
//               tree's, or the path of a .js file; the ratios divide by
//               the first (default before=55d600b,shadow=8ed9889,now=.:
//               before the shadow-root work, the shadow-root work as it
//               was first committed, this tree)
//   --controls  form controls on the page (default 2000)
//   --reps      measured runs of each tool per copy and scenario (default 11)
// The defaults take ~8 minutes, most of it the "shadow" copy on "sparse"
// (~7 s a run).
//
// The page is tests/pages/many-controls.html (fieldsets of 8 labelled
// controls; every 4th fieldset inside the shadow root of a custom element
// with a slot). Scenarios: "closed" (those roots closed), "open" (open),
// "none" (no shadow root: every copy gives the same outline), "sparse"
// (closed roots, and the form in a narrow absolute column, so that a hit
// test in the middle of the viewport lands on <html>) and "plain" (no
// shadow root and no checkbox or radio: text fields instead, so no read
// makes a visibility check: what is left is the walk's own cost).
//
// Each copy runs where the real script runs: a content script of an
// unpacked extension (written to a temp dir), so `chrome.dom` is Chrome's own
// (an extension binding; a stub in the page's world would cost far less per
// call). All copies live in the same isolated world of the same page, each
// with its own `chrome` whose `runtime.onConnect` is a stub (a fake Port
// per copy) and whose `dom` is Chrome's, behind a counter. The time is
// taken in the page, from handing the copy its tool.execute to the
// tool.result it posts. Each repetition runs every copy once per tool, the
// order rotated. Prints per scenario what one chrome.dom call costs there,
// and per tool the median ms of each copy, the ratio of medians to the
// first copy, the median per-repetition ratio, chrome.dom calls and hit
// tests (elementFromPoint) per run, and whether the result's text is the
// same as the last copy's (copies that differ only in speed give the same
// text everywhere; one from before the shadow-root work only on "none" and
// "open", as it does not see closed roots). Measures only: not part of
// `make test` or `make bench`.

import { chromium } from 'playwright-core';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { CHROMIUM_PATH, REPO_ROOT, waitFor } from '../tests/support/browser.mjs';
import { startStaticServer } from '../tests/support/static-server.mjs';
import { option } from './bench/args.mjs';
import { median, round } from './bench/stats.mjs';

const reps = Number(option('--reps', 11));
const warmup = Number(option('--warmup', 3));
const controls = Number(option('--controls', 2000));
const scenarioNames = option('--scenarios', 'closed,open,none,sparse,plain').split(',').filter(Boolean);
const versionSpecs = option('--versions', 'before=55d600b,shadow=8ed9889,now=.').split(',').filter(Boolean);
const TOOLS = ['page_snapshot', 'read_page'];
const SCENARIOS = {
  closed: 'roots=closed',
  open: 'roots=open',
  none: 'roots=none',
  sparse: 'roots=closed&layout=sparse',
  plain: 'roots=none&toggles=0',
};
if (!(reps > 0) || !(warmup >= 0) || !(controls > 0) || versionSpecs.length < 1 || scenarioNames.some((name) => !SCENARIOS[name])) {
  process.stderr.write('usage: node scripts/bench-content-snapshot.mjs [--reps N] [--warmup N] [--controls N] [--scenarios closed,open,none,sparse,plain] [--versions name=REV,...]\n');
  process.exit(2);
}

const INSTALLED = 'Symbol.for("sw-agent.content-script.installed")';

/** [{ name, source }]: each copy's content.js, its install guard renamed so that all of them install in one world. */
function versions() {
  return versionSpecs.map((spec) => {
    const [name, rev] = spec.includes('=') ? spec.split('=') : [spec, spec];
    const file = rev === '.' ? path.join(REPO_ROOT, 'extension', 'content', 'content.js') : rev.endsWith('.js') ? path.resolve(rev) : null;
    const source = file
      ? readFileSync(file, 'utf8')
      : execFileSync('git', ['show', `${rev}:extension/content/content.js`], { cwd: REPO_ROOT, encoding: 'utf8', maxBuffer: 1 << 26 });
    if (!source.includes(INSTALLED)) throw new Error(`${spec}: content.js has no ${INSTALLED}`);
    return { name, rev, source: source.replace(INSTALLED, `Symbol.for("sw-agent.content-script.installed.bench.${name}")`) };
  });
}

/**
 * The content script that runs first: `__benchInstall(name, install)` gives a
 * copy its own `chrome` (a runtime stub and a counting front of Chrome's
 * chrome.dom) and a fake Port; `__bench.run(name, tool)` times one call.
 * Hit tests are counted for all copies alike.
 */
const HARNESS = `(() => {
  const counts = { dom: 0, hits: 0 };
  const realDom = chrome.dom && typeof chrome.dom.openOrClosedShadowRoot === 'function' ? chrome.dom : null;
  const openOrClosed = realDom ? realDom.openOrClosedShadowRoot.bind(realDom) : null;
  const dom = openOrClosed ? { openOrClosedShadowRoot(element) { counts.dom += 1; return openOrClosed(element); } } : undefined;
  for (const proto of [Document.prototype, ShadowRoot.prototype]) {
    const hit = proto.elementFromPoint;
    proto.elementFromPoint = function elementFromPoint(x, y) { counts.hits += 1; return hit.call(this, x, y); };
  }
  const copies = {};
  let nextId = 1;
  globalThis.__benchInstall = (name, install) => {
    const connect = [];
    install({ runtime: { onConnect: { addListener: (listener) => connect.push(listener) } }, dom });
    const onMessage = [];
    let waiting = null;
    const port = {
      name: 'page',
      onMessage: { addListener: (listener) => onMessage.push(listener) },
      onDisconnect: { addListener() {} },
      postMessage(message) {
        if (message && message.type === 'tool.result' && waiting && waiting.callId === message.callId) {
          const at = performance.now();
          const done = waiting;
          waiting = null;
          done.resolve(at, message);
        }
      },
    };
    for (const listener of connect) listener(port);
    copies[name] = (tool) => new Promise((resolve) => {
      const callId = 'bench-' + nextId++;
      const message = { type: 'tool.execute', callId, name: tool, params: {}, frameId: 0 };
      const start = performance.now();
      waiting = { callId, resolve: (at, result) => resolve({ start, at, message: result }) };
      for (const listener of onMessage) listener(message);
    });
  };
  globalThis.__bench = {
    ready: (count) => Object.keys(copies).length >= count,
    dom: Boolean(realDom),
    /** µs per chrome.dom.openOrClosedShadowRoot call, asked about the page's <div>s and <span>s. */
    domCost() {
      if (!openOrClosed) return NaN;
      const elements = Array.from(document.querySelectorAll('div, span'));
      const start = performance.now();
      for (const element of elements) openOrClosed(element);
      return ((performance.now() - start) / elements.length) * 1000;
    },
    async run(name, tool, withContent) {
      const before = { ...counts };
      const { start, at, message } = await copies[name](tool);
      return {
        ms: at - start,
        ok: message.ok,
        dom: counts.dom - before.dom,
        hits: counts.hits - before.hits,
        length: message.content.length,
        ...(withContent ? { content: message.content } : {}),
      };
    },
  };
})();
`;

/** A temp unpacked extension whose content scripts are the harness and every copy. */
function writeExtension(copies) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'bench-content-'));
  const files = ['harness.js'];
  writeFileSync(path.join(dir, 'harness.js'), HARNESS);
  for (const copy of copies) {
    const file = `copy-${copy.name}.js`;
    writeFileSync(path.join(dir, file), `globalThis.__benchInstall(${JSON.stringify(copy.name)}, function (chrome) {\n${copy.source}\n});\n`);
    files.push(file);
  }
  writeFileSync(path.join(dir, 'manifest.json'), JSON.stringify({
    manifest_version: 3,
    name: 'content snapshot bench',
    version: '1.0',
    content_scripts: [{ matches: ['http://127.0.0.1/*'], js: files, run_at: 'document_idle' }],
  }));
  return dir;
}

/** Opens `url` and returns `evaluate(expression)` in the extension's isolated world there. */
async function openInWorld(context, page, url) {
  const session = await context.newCDPSession(page);
  const worlds = [];
  session.on('Runtime.executionContextCreated', (event) => worlds.push(event.context));
  session.on('Runtime.executionContextsCleared', () => worlds.splice(0));
  await session.send('Runtime.enable');
  await page.goto(url);
  const evaluate = async (expression) => {
    const world = worlds.filter((w) => w.origin.startsWith('chrome-extension://') && w.auxData?.isDefault === false).at(-1);
    if (!world) throw new Error('no content-script world yet');
    const { result, exceptionDetails } = await session.send('Runtime.evaluate', { contextId: world.id, expression, awaitPromise: true, returnByValue: true });
    if (exceptionDetails) throw new Error(exceptionDetails.exception?.description ?? exceptionDetails.text);
    return result.value;
  };
  await waitFor(() => evaluate(`typeof __bench === "object" && __bench.ready(${copies.length})`), { timeout: 30000, interval: 100, message: 'the bench content scripts' });
  return { evaluate, close: () => session.detach().catch(() => {}) };
}

const copies = versions();
const extension = writeExtension(copies);
const server = await startStaticServer();
const userDataDir = mkdtempSync(path.join(os.tmpdir(), 'bench-content-profile-'));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath: CHROMIUM_PATH,
  headless: true,
  ignoreDefaultArgs: ['--disable-extensions'],
  viewport: { width: 1000, height: 800 },
  args: [
    '--no-sandbox', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run',
    `--disable-extensions-except=${extension}`, `--load-extension=${extension}`,
  ],
});

try {
  const page = await context.newPage();
  const names = copies.map((copy) => copy.name);
  const chromium = context.browser()?.version() ?? execFileSync(CHROMIUM_PATH, ['--version'], { encoding: 'utf8' }).trim();
  console.log(`content script bench: ${controls} controls, ${reps} reps (+${warmup} warm-up), copies ${copySummary()}; ${chromium}`);
  for (const scenario of scenarioNames) {
    const url = server.url(`many-controls.html?n=${controls}&${SCENARIOS[scenario]}`).replace('localhost', '127.0.0.1');
    const world = await openInWorld(context, page, url);
    if (!(await world.evaluate('__bench.dom'))) console.log('  (no chrome.dom in the content script: closed roots are not seen)');
    const run = (name, tool, withContent = false) => world.evaluate(`__bench.run(${JSON.stringify(name)}, ${JSON.stringify(tool)}, ${withContent})`);
    const samples = Object.fromEntries(TOOLS.map((tool) => [tool, Object.fromEntries(names.map((name) => [name, []]))]));
    const last = Object.fromEntries(TOOLS.map((tool) => [tool, {}]));
    for (let rep = -warmup; rep < reps; rep++) {
      // Rotate who goes first, so no copy always runs on a cold or a warm page.
      const offset = ((rep % names.length) + names.length) % names.length;
      const order = names.map((_, i) => names[(i + offset) % names.length]);
      for (const tool of TOOLS) {
        for (const name of order) {
          const outcome = await run(name, tool, rep === reps - 1);
          if (!outcome.ok) throw new Error(`${scenario} ${name} ${tool} failed: ${outcome.content ?? ''}`);
          if (rep >= 0) samples[tool][name].push(outcome);
          if (rep === reps - 1) last[tool][name] = outcome;
        }
      }
    }
    const domCost = [];
    for (let i = 0; i < 5; i++) domCost.push(await world.evaluate('__bench.domCost()'));
    console.log(`\n${scenario} (${url.replace(/^.*\//, '')}; chrome.dom.openOrClosedShadowRoot ${round(median(domCost))} µs a call)`);
    for (const tool of TOOLS) {
      const base = samples[tool][names[0]];
      const reference = last[tool][names[names.length - 1]].content;
      console.log(`  ${tool}`);
      for (const name of names) {
        const mine = samples[tool][name];
        const ms = median(mine.map((s) => s.ms));
        const ratio = ms / median(base.map((s) => s.ms));
        const perRep = median(mine.map((s, i) => s.ms / base[i].ms));
        const same = last[tool][name].content === reference ? 'same text' : `other text (${last[tool][name].length} chars)`;
        console.log(
          `    ${name.padEnd(8)} ${String(round(ms)).padStart(7)} ms  ×${String(round(ratio)).padEnd(5)} (per rep ×${String(round(perRep)).padEnd(5)})` +
            `  chrome.dom ${String(median(mine.map((s) => s.dom))).padStart(6)}  hit tests ${String(median(mine.map((s) => s.hits))).padStart(5)}  ${same}`,
        );
      }
    }
    await world.close();
  }
} finally {
  await context.close().catch(() => {});
  await server.close();
  rmSync(userDataDir, { recursive: true, force: true });
  rmSync(extension, { recursive: true, force: true });
}

function copySummary() {
  return copies.map((copy) => `${copy.name}=${copy.rev === '.' ? 'work tree' : copy.rev}`).join(', ');
}
