// Browser helpers for the end-to-end tests and the demo (playwright-core +
// Debian's Chromium).
//
// Owns: launching Chromium with the unpacked extension in a fresh profile,
// finding the extension id, opening the side panel page as a tab, driving its
// settings UI, killing the extension's service worker through CDP, reading
// the panel DOM, evaluating code as a real content script of the extension,
// and dumping the extension's IndexedDB.
// Must not: download a browser, touch anything outside its temp profile, or
// depend on wall-clock durations for correctness (everything polls).

import { chromium } from 'playwright-core';
import { copyFileSync, cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { builtManifest } from '../../scripts/built-manifest.mjs';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
/** The built extension; EXTENSION_DIR overrides it (e.g. to test another build). */
export const DEFAULT_EXTENSION_PATH = process.env.EXTENSION_DIR
  ? path.resolve(process.env.EXTENSION_DIR)
  : path.join(REPO_ROOT, 'dist', 'extension');
export const CHROMIUM_PATH = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
export const PANEL_PATH = 'sidepanel/index.html';

/**
 * Polls `fn` until it returns a truthy value (or resolves to one) and returns
 * that value. Exceptions thrown by `fn` count as "not yet" and the last one is
 * reported on timeout.
 */
export async function waitFor(fn, { timeout = 60000, interval = 100, message = 'condition' } = {}) {
  const deadline = Date.now() + timeout;
  let lastError = null;
  for (;;) {
    try {
      const value = await fn();
      if (value) return value;
      lastError = null;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() >= deadline) {
      const detail = lastError ? ` (last error: ${lastError.message ?? lastError})` : '';
      throw new Error(`waitFor: timed out after ${timeout} ms waiting for ${message}${detail}`);
    }
    await new Promise((resolve) => setTimeout(resolve, interval));
  }
}

/** Throws a clear error when the built extension is missing. */
/** The copies copyOfBuild made; removed when the test process exits. */
const copies = [];

/**
 * A copy of the built extension (DEFAULT_EXTENSION_PATH) in a temp
 * directory, as an embedding extension would ship it: `files` (name →
 * content, e.g. `{ 'mcp-servers.js': … }`) written over the copy's own, and
 * with `pkg` (a directory holding `<name>_bg.wasm` and `<name>.js`, such as
 * a variant's out_dir) its module and glue replaced and the manifest made
 * again for them (scripts/built-manifest.mjs: the build id the module cache
 * keys on; without MCP, no `identity` permission). Removed at exit.
 * @param {Record<string, string>} [files]
 * @param {{ pkg?: string, mcp?: boolean }} [options]
 */
export function copyOfBuild(files = {}, { pkg = null, mcp = true } = {}) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'agent-ext-copy-'));
  if (copies.length === 0) process.once('exit', () => copies.forEach((d) => rmSync(d, { recursive: true, force: true })));
  copies.push(dir);
  cpSync(DEFAULT_EXTENSION_PATH, dir, { recursive: true });
  for (const [name, content] of Object.entries(files)) writeFileSync(path.join(dir, name), content);
  if (pkg) {
    const wasm = readdirSync(pkg).find((f) => f.endsWith('_bg.wasm'));
    if (!wasm) throw new Error(`${pkg} holds no module (*_bg.wasm)`);
    const glue = wasm.replace(/_bg\.wasm$/, '.js');
    for (const file of [wasm, glue]) copyFileSync(path.join(pkg, file), path.join(dir, 'pkg', file));
    const buildId = createHash('sha256')
      .update(readFileSync(path.join(dir, 'pkg', wasm)))
      .update(readFileSync(path.join(dir, 'pkg', glue)))
      .digest('hex')
      .slice(0, 16);
    const manifestPath = path.join(dir, 'manifest.json');
    const source = JSON.parse(readFileSync(path.join(REPO_ROOT, 'extension', 'manifest.json'), 'utf8'));
    const { manifest, problems } = builtManifest(source, { buildId, mcp });
    if (problems.length > 0) throw new Error(`manifest: ${problems.join('; ')}`);
    writeFileSync(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`);
  }
  return dir;
}

export function assertExtensionBuilt(extensionPath = DEFAULT_EXTENSION_PATH) {
  const manifest = path.join(extensionPath, 'manifest.json');
  if (!existsSync(manifest) || !statSync(manifest).isFile()) {
    throw new Error(
      `The built extension is missing: ${manifest} does not exist. Run \`make build\` first (it produces dist/extension).`,
    );
  }
  if (!existsSync(CHROMIUM_PATH)) {
    throw new Error(`Chromium is missing at ${CHROMIUM_PATH} (install Debian's chromium package, or set CHROMIUM_PATH).`);
  }
}

/** For scripts: stop with a one-line message (exit 1) when the extension is not built. */
export function exitUnlessExtensionBuilt(label, extensionPath = DEFAULT_EXTENSION_PATH) {
  try {
    assertExtensionBuilt(extensionPath);
  } catch (error) {
    process.stderr.write(`${label}: ${error.message}\n`);
    process.exit(1);
  }
}

/**
 * Init script that records every message the panel's Ports send and receive
 * into `window.__portLog` (JSON strings, so later mutation by the panel cannot
 * change the record). Only active on the extension's own pages.
 *
 * It can also hold the panel's outgoing messages of some types back (see
 * `holdOutgoing`), to look at the panel while an answer is on its way.
 */
function portRecorderInitScript() {
  if (location.protocol !== 'chrome-extension:') return;
  const runtime = globalThis.chrome && globalThis.chrome.runtime;
  if (!runtime || typeof runtime.connect !== 'function' || globalThis.__portLog) return;
  const log = [];
  Object.defineProperty(globalThis, '__portLog', { value: log, enumerable: false });
  // Outgoing messages whose type is in `types` wait in `held` (recorded when
  // the panel sent them) until `release()` posts them, in order, or
  // `release(false)` drops them (the worker never sees them).
  const hold = {
    types: [],
    held: [],
    release(send = true) {
      hold.types = [];
      for (const post of hold.held.splice(0)) {
        if (!send) continue;
        try {
          post();
        } catch {
          // The port closed meanwhile: the panel re-sends on reconnect.
        }
      }
    },
  };
  Object.defineProperty(globalThis, '__portHold', { value: hold, enumerable: false });
  // Incoming messages whose type is in `types`, on the connection that was
  // the newest when they were set (`dropIncoming`), are recorded but never
  // reach the page: answers lost with a worker killed before they arrived.
  const drop = { types: [], connection: 0 };
  Object.defineProperty(globalThis, '__portDrop', {
    value: (types) => {
      drop.types = types;
      drop.connection = connections;
    },
    enumerable: false,
  });
  const inject = { into: null };
  Object.defineProperty(globalThis, '__portInject', { value: (message) => inject.into?.(message), enumerable: false });
  const originalConnect = runtime.connect.bind(runtime);
  let connections = 0;
  const wrapped = function connect(...args) {
    const port = originalConnect(...args);
    connections += 1;
    const connection = connections;
    const name = port.name;
    log.push({ dir: 'connect', connection, name, at: Date.now() });
    port.onMessage.addListener((message) => {
      log.push({ dir: 'in', connection, name, at: Date.now(), json: JSON.stringify(message) });
    });
    port.onDisconnect.addListener(() => {
      log.push({ dir: 'disconnect', connection, name, at: Date.now() });
    });
    // The page's own listeners, so a test can hand it a message as if the
    // worker had sent it (`injectIncoming`), on the newest port.
    const listeners = [];
    const addListener = port.onMessage.addListener.bind(port.onMessage);
    port.onMessage.addListener = (listener) => {
      listeners.push(listener);
      return addListener((message, from) => {
        if (drop.connection === connection && drop.types.includes(message?.type)) {
          log.push({ dir: 'dropped', connection, name, at: Date.now(), json: JSON.stringify(message) });
          return undefined;
        }
        return listener(message, from);
      });
    };
    inject.into = (message) => {
      log.push({ dir: 'in', connection, name, at: Date.now(), json: JSON.stringify(message), injected: true });
      for (const listener of listeners) listener(message, port);
    };
    const originalPost = port.postMessage.bind(port);
    port.postMessage = (message) => {
      log.push({ dir: 'out', connection, name, at: Date.now(), json: JSON.stringify(message) });
      if (hold.types.includes(message?.type)) {
        hold.held.push(() => originalPost(message));
        return undefined;
      }
      return originalPost(message);
    };
    return port;
  };
  try {
    runtime.connect = wrapped;
  } catch {
    // Not writable in this build: the tests then run without the recorder.
  }
}

/**
 * Launches Chromium with the unpacked extension in a fresh temp profile.
 * @returns {Promise<{ context, extensionId, userDataDir, consoleLog, serviceWorkerUrl, close }>}
 */
export async function launchWithExtension(options = {}) {
  const extensionPath = path.resolve(options.extensionPath ?? DEFAULT_EXTENSION_PATH);
  assertExtensionBuilt(extensionPath);
  const userDataDir = mkdtempSync(path.join(os.tmpdir(), 'agent-ext-profile-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM_PATH,
    // Playwright's `--headless` is Chromium's new headless mode, which runs
    // extensions (verified on Chromium 156: the module SW starts, Ports work,
    // CDP Target.closeTarget kills it).
    headless: options.headless ?? true,
    // Playwright adds --disable-extensions by default; the explicit
    // --disable-extensions-except below would win anyway, but be unambiguous.
    ignoreDefaultArgs: ['--disable-extensions'],
    viewport: options.viewport ?? { width: 1000, height: 800 },
    args: [
      '--no-sandbox',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
      `--disable-extensions-except=${extensionPath}`,
      `--load-extension=${extensionPath}`,
      ...(options.extraArgs ?? []),
    ],
  });
  const consoleLog = [];
  context.on('console', (message) => {
    let source = 'page';
    try {
      const worker = typeof message.worker === 'function' ? message.worker() : null;
      if (worker) source = `worker ${worker.url()}`;
      else if (message.page()) source = `page ${message.page().url()}`;
    } catch {
      // keep the default source
    }
    consoleLog.push({ source, type: message.type(), text: message.text() });
  });
  if (options.recordPorts !== false) {
    await context.addInitScript(portRecorderInitScript);
  }

  let extensionId;
  let serviceWorkerUrl;
  try {
    const worker = await waitForExtensionServiceWorker(context, { timeout: options.timeout ?? 60000 });
    serviceWorkerUrl = worker.url();
    extensionId = new URL(serviceWorkerUrl).host;
  } catch (error) {
    await context.close().catch(() => {});
    rmSync(userDataDir, { recursive: true, force: true });
    throw error;
  }

  let closed = false;
  return {
    context,
    extensionId,
    userDataDir,
    consoleLog,
    serviceWorkerUrl,
    async close() {
      if (closed) return;
      closed = true;
      await context.close().catch(() => {});
      rmSync(userDataDir, { recursive: true, force: true });
    },
  };
}

/** Waits for (or finds) a chrome-extension:// service worker of this context. */
export async function waitForExtensionServiceWorker(context, { timeout = 60000, extensionId } = {}) {
  const matches = (worker) =>
    worker.url().startsWith(extensionId ? `chrome-extension://${extensionId}/` : 'chrome-extension://');
  const deadline = Date.now() + timeout;
  for (;;) {
    const found = context.serviceWorkers().find(matches);
    if (found) return found;
    const remaining = deadline - Date.now();
    if (remaining <= 0) {
      throw new Error(
        'No extension service worker appeared. Is dist/extension a valid MV3 extension with background.service_worker? ' +
          'Check the manifest and the SW for load errors.',
      );
    }
    await context.waitForEvent('serviceworker', { timeout: Math.min(remaining, 1000) }).catch(() => {});
  }
}

/** The extension id of a launched context (from its service worker URL). */
export async function getExtensionId(context, options = {}) {
  const worker = await waitForExtensionServiceWorker(context, options);
  return new URL(worker.url()).host;
}

/**
 * Opens the side panel page as a tab and waits until it rendered its first
 * snapshot (`body[data-ready="true"]`).
 */
export async function openPanel(context, extensionId, { viewport = { width: 420, height: 800 }, timeout = 60000 } = {}) {
  const panel = await context.newPage();
  await panel.setViewportSize(viewport);
  await panel.goto(`chrome-extension://${extensionId}/${PANEL_PATH}`);
  await waitFor(() => panel.evaluate(() => document.body && document.body.dataset.ready === 'true'), {
    timeout,
    message: 'the side panel to render its first snapshot (body[data-ready="true"])',
  });
  return panel;
}

async function setField(page, selector, value) {
  if (value === undefined || value === null) return;
  const locator = page.locator(selector);
  const tag = await locator.evaluate((element) => element.tagName);
  if (tag === 'SELECT') await locator.selectOption(String(value));
  else await locator.fill(String(value));
}

/**
 * Fills the panel's settings form and saves it; waits for `#settings-status`
 * to read "Saved".
 */
export async function configureProvider(panel, { provider = 'openai', baseUrl, model, apiKey, maxTokens, temperature } = {}) {
  const baseUrlField = panel.locator('#settings-base-url');
  const openedHere = !(await baseUrlField.isVisible());
  if (openedHere) {
    await panel.click('#settings-toggle');
    await baseUrlField.waitFor({ state: 'visible', timeout: 15000 });
  }
  if (await panel.locator('#settings-provider').count()) await setField(panel, '#settings-provider', provider);
  await setField(panel, '#settings-base-url', baseUrl);
  await setField(panel, '#settings-model', model);
  await setField(panel, '#settings-api-key', apiKey);
  if (maxTokens !== undefined) await setField(panel, '#settings-max-tokens', maxTokens);
  if (temperature !== undefined) await setField(panel, '#settings-temperature', temperature);
  await panel.click('#settings-save');
  await waitFor(
    async () => /saved/i.test((await panel.locator('#settings-status').textContent()) ?? ''),
    { timeout: 15000, message: '#settings-status to read "Saved"' },
  );
  // The form may have been filled before the panel's own async settings load
  // finished; check what was stored, not just what the form showed.
  const stored = await panel.evaluate(async () => (await chrome.storage.local.get('settings')).settings ?? null);
  const expected = { baseUrl: baseUrl?.replace(/\/+$/, ''), model, apiKey };
  for (const [key, value] of Object.entries(expected)) {
    if (value !== undefined && stored?.[key] !== value) {
      throw new Error(`configureProvider: stored settings.${key} is ${JSON.stringify(stored?.[key])}, expected ${JSON.stringify(value)}`);
    }
  }
  if (openedHere) {
    // Leave the panel as found: the conversation, not the form, in view.
    await panel.click('#settings-toggle');
    await baseUrlField.waitFor({ state: 'hidden', timeout: 15000 });
  }
}

/** Types a task into `#task-input` and presses Enter. */
export async function submitTask(panel, text) {
  await panel.fill('#task-input', text);
  await panel.press('#task-input', 'Enter');
}

/** A browser-level CDP session (cached per context). */
const browserSessions = new WeakMap();
export async function browserCdp(context) {
  let entry = browserSessions.get(context);
  if (entry) return entry;
  const browser = context.browser();
  let session;
  if (browser && typeof browser.newBrowserCDPSession === 'function') {
    session = await browser.newBrowserCDPSession();
  } else {
    // Fallback: the Target domain also answers on a page session.
    const page = context.pages()[0] ?? (await context.newPage());
    session = await context.newCDPSession(page);
  }
  entry = { session, send: (method, params) => session.send(method, params) };
  browserSessions.set(context, entry);
  return entry;
}

/** CDP targets of type service_worker belonging to the extension. */
export async function serviceWorkerTargets(context, extensionId) {
  const cdp = await browserCdp(context);
  const { targetInfos } = await cdp.send('Target.getTargets');
  return targetInfos.filter(
    (target) => target.type === 'service_worker' && target.url.startsWith(`chrome-extension://${extensionId}/`),
  );
}

/**
 * Watches the running status of the extension's service worker through the
 * CDP ServiceWorker domain of a page session (`running`, `stopping`,
 * `stopped`, `starting`). Cached per page.
 */
const workerWatchers = new WeakMap();
async function serviceWorkerWatcher(page) {
  let watcher = workerWatchers.get(page);
  if (watcher) return watcher;
  const session = await page.context().newCDPSession(page);
  const events = [];
  session.on('ServiceWorker.workerVersionUpdated', ({ versions }) => {
    for (const version of versions) {
      events.push({ versionId: version.versionId, scriptURL: version.scriptURL, runningStatus: version.runningStatus, at: Date.now() });
    }
  });
  await session.send('ServiceWorker.enable');
  watcher = { session, events };
  workerWatchers.set(page, watcher);
  return watcher;
}

/**
 * Kills the extension's service worker through CDP (`Target.closeTarget` on
 * its service_worker target) and waits until the worker is really stopped.
 *
 * Proof of the kill: Chromium keeps the same target id for a restarted worker
 * of the same version and sends no Target.targetDestroyed, so target presence
 * proves nothing; instead the ServiceWorker domain (on an extension page, or
 * any page of the context) must report the version `stopped` after the close.
 * A reconnecting panel may restart the worker right after that.
 * @param {{ page?: import('playwright-core').Page, timeout?: number }} [options]
 * @returns {Promise<{ killedTargetIds: string[] }>}
 */
export async function killServiceWorker(context, extensionId, { page, timeout = 30000 } = {}) {
  const prefix = `chrome-extension://${extensionId}/`;
  const cdp = await browserCdp(context);
  const observer =
    page ??
    context.pages().find((candidate) => candidate.url().startsWith(prefix)) ??
    context.pages()[0] ??
    (await context.newPage());
  const watcher = await serviceWorkerWatcher(observer);
  const targets = await waitFor(
    async () => {
      const found = await serviceWorkerTargets(context, extensionId);
      return found.length > 0 ? found : null;
    },
    { timeout, message: `a running service worker target of extension ${extensionId}` },
  );
  const eventsBefore = watcher.events.length;
  const killedTargetIds = [];
  for (const target of targets) {
    const { success } = await cdp.send('Target.closeTarget', { targetId: target.targetId });
    if (success === false) throw new Error(`Target.closeTarget refused to close ${target.targetId}`);
    killedTargetIds.push(target.targetId);
  }
  await waitFor(
    () =>
      watcher.events
        .slice(eventsBefore)
        .some((event) => event.scriptURL.startsWith(prefix) && event.runningStatus === 'stopped'),
    { timeout, interval: 20, message: 'the ServiceWorker domain to report the killed worker as stopped' },
  );
  return { killedTargetIds };
}

/**
 * Updates the extension in place, as Chrome does when a new version arrives:
 * CDP `Extensions.loadUnpacked` of the same directory keeps the extension id
 * and its IndexedDB, stops the old worker (its fetches end, its pages close,
 * the content scripts it injected are orphaned in their pages) and starts
 * the new one. Needs a browser launched with
 * `--enable-unsafe-extension-debugging`. Resolves to the new worker.
 */
export async function updateExtension(context, extensionId, { extensionPath = DEFAULT_EXTENSION_PATH, timeout = 60000 } = {}) {
  const prefix = `chrome-extension://${extensionId}/`;
  const before = new Set(context.serviceWorkers().filter((w) => w.url().startsWith(prefix)));
  const cdp = await browserCdp(context);
  const { id } = await cdp.send('Extensions.loadUnpacked', { path: path.resolve(extensionPath) });
  if (id !== extensionId) throw new Error(`Extensions.loadUnpacked loaded ${id}, not ${extensionId}`);
  return waitFor(
    () => context.serviceWorkers().find((w) => w.url().startsWith(prefix) && !before.has(w)) ?? null,
    { timeout, message: 'the updated extension to start a new service worker' },
  );
}

/** Running-status history of the extension's worker seen by killServiceWorker's watcher on `page`. */
export async function serviceWorkerStatusLog(page, extensionId) {
  const watcher = await serviceWorkerWatcher(page);
  return watcher.events.filter((event) => event.scriptURL.startsWith(`chrome-extension://${extensionId}/`));
}

/**
 * Records every change of `#connection`'s data-connected / data-epoch into
 * `window.__connectionLog` (so a brief disconnect cannot be missed by polling).
 */
export async function watchConnection(panel) {
  await panel.evaluate(() => {
    const element = document.getElementById('connection');
    if (!element || window.__connectionLog) return;
    const log = [];
    window.__connectionLog = log;
    const record = () => log.push({ connected: element.dataset.connected, epoch: element.dataset.epoch, at: Date.now() });
    record();
    new MutationObserver(record).observe(element, { attributes: true, attributeFilter: ['data-connected', 'data-epoch'] });
  });
}

export async function connectionLog(panel) {
  return panel.evaluate(() => window.__connectionLog ?? []);
}

/** The panel's status, connection and rendered nodes, read from the DOM. */
export async function readPanel(panel) {
  return panel.evaluate(() => {
    const text = (element) => (element ? element.innerText.replace(/\s+/g, ' ').trim() : '');
    const status = document.getElementById('status');
    const connection = document.getElementById('connection');
    const banner = document.getElementById('error-banner');
    const own = (element, selector) => element.querySelector(`:scope > ${selector}, :scope > * > ${selector}`);
    const nodes = [...document.querySelectorAll('#messages .node')].map((element) => {
      const kind = element.dataset.kind ?? '';
      const node = {
        kind,
        nodeId: element.dataset.nodeId ?? '',
        callId: element.dataset.callId ?? null,
        status: element.dataset.status ?? null,
        streaming: element.classList.contains('streaming'),
        parentNodeId: element.parentElement?.closest('#messages .node')?.dataset.nodeId ?? null,
        toolName: null,
        args: null,
        text: '',
        // What the result's details show in the card (screenshot thumbnail, snapshot diff).
        thumbnail: null,
        diff: null,
      };
      const extras = element.querySelector(':scope > .tool-extras');
      const thumbnail = extras?.querySelector('img.tool-thumbnail');
      if (thumbnail) {
        node.thumbnail = {
          src: thumbnail.getAttribute('src'),
          naturalWidth: thumbnail.naturalWidth,
          naturalHeight: thumbnail.naturalHeight,
          visible: thumbnail.getClientRects().length > 0 && thumbnail.complete,
        };
      }
      const diff = extras?.querySelector('.snapshot-diff');
      if (diff) {
        node.diff = {
          summary: diff.querySelector('summary')?.textContent.trim() ?? '',
          added: [...diff.querySelectorAll('.diff-added')].map((line) => line.textContent.replace(/\n$/, '')),
          removed: [...diff.querySelectorAll('.diff-removed')].map((line) => line.textContent.replace(/\n$/, '')),
          open: diff.open,
        };
      }
      if (kind === 'tool_call') {
        const label = own(element, '.tool-label');
        const name = own(element, '.tool-name');
        node.toolName = element.dataset.toolName ?? (name ?? label)?.textContent.trim() ?? null;
        node.label = label ? label.textContent.trim() : null;
        const args = own(element, '.tool-args');
        node.args = args ? args.textContent.replace(/\s+/g, ' ').trim() : null;
        node.text = [node.label, node.args].filter(Boolean).join(' ');
      } else if (kind === 'tool_result') {
        const body = element.querySelector('.tool-result-text');
        node.text = (body ? body.textContent : element.textContent).trim();
      } else if (element.querySelector(':scope > .node-actions') && element.getClientRects().length > 0) {
        // The message without its action buttons (Edit, Fork from here, version switcher).
        node.text = [...element.childNodes]
          .filter((child) => !(child instanceof Element && child.matches('.node-actions')))
          .map((child) => (child instanceof HTMLElement ? (child.getClientRects().length > 0 ? child.innerText : '') : child.textContent))
          .join(' ')
          .replace(/\s+/g, ' ')
          .trim();
      } else {
        node.text = text(element);
      }
      return node;
    });
    return {
      ready: document.body.dataset.ready === 'true',
      state: status ? status.dataset.state ?? '' : '',
      turnId: status ? status.dataset.turnId ?? '' : '',
      connected: connection ? connection.dataset.connected ?? '' : '',
      epoch: connection ? connection.dataset.epoch ?? '' : '',
      error: banner && banner.offsetParent !== null ? text(banner) : '',
      nodes,
    };
  });
}

/** Waits until `#status[data-state]` is one of `states`; returns the panel state. */
export async function waitForRunState(panel, states, { timeout = 120000 } = {}) {
  const wanted = Array.isArray(states) ? states : [states];
  return waitFor(
    async () => {
      const state = await readPanel(panel);
      return wanted.includes(state.state) ? state : null;
    },
    { timeout, interval: 200, message: `#status[data-state] in ${JSON.stringify(wanted)}` },
  );
}

/** The side panel's approval card (`#approval-card`), read from the DOM; null if the panel has none. */
export async function readApprovalCard(panel) {
  return panel.evaluate(() => {
    const card = document.getElementById('approval-card');
    if (!card) return null;
    const text = (id) => (document.getElementById(id)?.textContent ?? '').trim();
    const params = text('approval-params');
    let parsedParams = null;
    try {
      parsedParams = JSON.parse(params);
    } catch {
      parsedParams = null;
    }
    return {
      visible: !card.hidden && card.getClientRects().length > 0,
      approvalId: card.dataset.approvalId ?? null,
      callId: card.dataset.callId ?? null,
      epoch: card.dataset.epoch ?? null,
      busy: card.getAttribute('aria-busy') === 'true',
      focused: card.contains(document.activeElement),
      heading: text('approval-heading').replace(/\s+/g, ' '),
      label: text('approval-tool-label'),
      toolName: text('approval-tool-name'),
      origin: text('approval-origin'),
      url: text('approval-url'),
      element: text('approval-element'),
      frame: document.getElementById('approval-frame')?.hidden ? '' : text('approval-frame'),
      params: parsedParams,
      paramsText: params,
      status: text('approval-status'),
      buttons: [...card.querySelectorAll('button')].map((b) => ({ id: b.id, text: b.textContent.trim(), disabled: b.disabled, hidden: b.hidden })),
    };
  });
}

/** Waits until the approval card is visible with its buttons enabled; returns it (see readApprovalCard). */
export async function waitForApprovalCard(panel, { timeout = 120000, message = '#approval-card to ask' } = {}) {
  return waitFor(
    async () => {
      const card = await readApprovalCard(panel);
      return card?.visible && card.buttons.length > 0 && card.buttons.every((b) => !b.disabled) ? card : null;
    },
    { timeout, interval: 50, message },
  );
}

/** The approval card's button for each decision of `approval.response`. */
export const APPROVAL_BUTTONS = {
  acceptOnce: '#approval-accept-once',
  acceptForSite: '#approval-accept-site',
  decline: '#approval-decline',
};

/**
 * Answers the next approval request through the side panel UI: waits for the
 * card, clicks the button of `decision` (a real mouse click, like a user), and
 * waits until the card is gone again (the engine's `approval.resolved`).
 * Returns the card as it was shown.
 */
export async function answerApprovalInPanel(panel, decision = 'acceptOnce', { timeout = 120000 } = {}) {
  const selector = APPROVAL_BUTTONS[decision];
  if (!selector) throw new Error(`unknown approval decision ${decision}`);
  const card = await waitForApprovalCard(panel, { timeout });
  await panel.click(selector);
  await waitFor(
    async () => {
      const now = await readApprovalCard(panel);
      return now && (!now.visible || now.approvalId !== card.approvalId);
    },
    { timeout, interval: 50, message: `#approval-card to close after ${decision}` },
  );
  return card;
}

/**
 * Every approval the panel was asked (Port log `approval.request` events and
 * the `approval` of `initialized` snapshots), with how it was resolved:
 * [{ id, toolName, label, params, origin, url, callId, status }] in order of
 * first appearance; `status` is the `approval.resolved` status, or "pending".
 */
export async function approvalHistory(panel) {
  const log = (await portLog(panel)) ?? [];
  const byId = new Map();
  for (const entry of log) {
    if (entry.dir !== 'in' || !entry.json) continue;
    const message = JSON.parse(entry.json);
    const asked = message.type === 'approval.request' ? message.approval
      : message.type === 'initialized' ? message.snapshot?.thread?.pendingApproval : null;
    if (asked && typeof asked.id === 'string' && !byId.has(asked.id)) {
      byId.set(asked.id, { ...asked, status: 'pending', requests: 0, snapshots: 0 });
    }
    if (asked && byId.has(asked.id)) byId.get(asked.id)[message.type === 'initialized' ? 'snapshots' : 'requests'] += 1;
    if (message.type === 'approval.resolved' && byId.has(message.approvalId)) byId.get(message.approvalId).status = message.status;
  }
  return [...byId.values()];
}

/** One transcript line per approval: `[approval] click {"ref":"e2"} on http://… → accepted_once`. */
export function approvalLine(approval) {
  return `[approval] ${approval.toolName} ${JSON.stringify(approval.params)} on ${approval.url} → ${approval.status}`;
}

/** Text lines describing each rendered node (used by the demo and on failures). */
export function transcriptLines(panelState, { approvals = [] } = {}) {
  const lines = [];
  for (const node of panelState.nodes) {
    const tags = [node.kind];
    if (node.toolName) tags.push(node.toolName);
    if (node.status) tags.push(`status=${node.status}`);
    if (node.streaming) tags.push('streaming');
    const indent = node.parentNodeId ? '    ' : '';
    const body = node.text.split('\n').join(`\n${indent}    `);
    lines.push(`${indent}[${tags.join(' ')}] ${body}`);
    // The question the user answered for this call, between the call and its result.
    if (node.kind === 'tool_call' && !node.parentNodeId) {
      for (const approval of approvals.filter((a) => a.callId && a.callId === node.callId)) lines.push(`    ${approvalLine(approval)}`);
    }
  }
  return lines;
}

/**
 * Holds the panel's outgoing messages of `types` back until the returned
 * function is called, which posts them in order, or with `{ drop: true }`
 * drops them (see portRecorderInitScript).
 * @returns {Promise<(options?: { drop?: boolean }) => Promise<void>>}
 */
export async function holdOutgoing(panel, types) {
  await panel.evaluate((t) => {
    globalThis.__portHold.types = t;
  }, types);
  return ({ drop = false } = {}) => panel.evaluate((send) => globalThis.__portHold.release(send), !drop);
}

/**
 * Hands the panel `message` as if the worker had sent it on the newest
 * port (see portRecorderInitScript): for answers a test cannot make the
 * engine give on cue.
 */
export async function injectIncoming(panel, message) {
  await panel.evaluate((m) => globalThis.__portInject(m), message);
}

/**
 * From now on, messages of `types` that the worker sends on the panel's
 * current Port are recorded (`dir: 'in'`, and `'dropped'`) but never reach
 * the panel, as if the worker had been killed before sending them; a Port
 * the panel opens later gets everything.
 */
export async function dropIncoming(panel, types) {
  await panel.evaluate((t) => globalThis.__portDrop(t), types);
}

/**
 * Tells `page` (a Playwright page, or the unattached browser's) it is
 * hidden or shown, as Chrome does when the side panel's window is
 * minimized or another tab's panel is shown: headless Chromium never hides
 * a page by itself.
 * @param {{ evaluate: (script: string) => Promise<unknown> }} page
 * @param {'hidden' | 'visible'} visibility
 */
export function setPageVisibility(page, visibility) {
  return page.evaluate(`(() => {
    Object.defineProperty(document, 'visibilityState', { value: ${JSON.stringify(visibility)}, configurable: true });
    Object.defineProperty(document, 'hidden', { value: ${visibility === 'hidden'}, configurable: true });
    document.dispatchEvent(new Event('visibilitychange'));
  })()`);
}

/** Every message recorded on the panel's Ports (see portRecorderInitScript). */
export async function portLog(panel) {
  return panel.evaluate(() => (globalThis.__portLog ? globalThis.__portLog.slice() : null));
}

/** Waits for the first `item.delta{toolProgress}` the panel received, and returns it. */
export async function waitForToolProgress(panel, { timeout = 60000, message = 'a tool progress event' } = {}) {
  return waitFor(
    async () => {
      const log = (await portLog(panel)) ?? [];
      return log
        .filter((entry) => entry.dir === 'in' && entry.json)
        .map((entry) => JSON.parse(entry.json))
        .find((m) => m.type === 'item.delta' && m.delta?.kind === 'toolProgress');
    },
    { timeout, interval: 100, message },
  );
}

/**
 * Reads every object store of every IndexedDB database of the extension's
 * origin, from an extension page (same origin as the service worker).
 * @returns {Promise<Record<string, Record<string, unknown[]>>>}
 */
export async function dumpIndexedDb(extensionPage) {
  return extensionPage.evaluate(async () => {
    const request = (req) =>
      new Promise((resolve, reject) => {
        req.onsuccess = () => resolve(req.result);
        req.onerror = () => reject(req.error);
      });
    const result = {};
    const databases = await indexedDB.databases();
    for (const info of databases) {
      const open = indexedDB.open(info.name);
      const db = await new Promise((resolve, reject) => {
        open.onsuccess = () => resolve(open.result);
        open.onerror = () => reject(open.error);
        open.onupgradeneeded = () => {
          // The database disappeared between databases() and open(): do not create it.
          open.transaction.abort();
        };
      });
      const stores = {};
      for (const storeName of db.objectStoreNames) {
        const transaction = db.transaction(storeName, 'readonly');
        const store = transaction.objectStore(storeName);
        const [keys, values] = await Promise.all([request(store.getAllKeys()), request(store.getAll())]);
        stores[storeName] = values.map((value, index) => ({ key: keys[index], value }));
      }
      db.close();
      result[info.name] = stores;
    }
    return JSON.parse(
      JSON.stringify(result, (_key, value) => {
        if (value instanceof ArrayBuffer) return { arrayBufferText: new TextDecoder().decode(value) };
        if (ArrayBuffer.isView(value)) return { arrayBufferText: new TextDecoder().decode(value) };
        if (value instanceof Blob) return { blob: value.size };
        return value;
      }),
    );
  });
}

/**
 * An expression to evaluate in the engine's worker: the disk fills up. While
 * `self.__diskFull` is set, every readwrite transaction of that worker
 * aborts after its requests were issued (as a full disk's
 * QuotaExceededError does); `self.__refusedWrites` counts them. A new worker
 * starts without it; setting `__diskFull = false` frees the disk.
 */
export const FILL_DISK_IN_WORKER = `(() => {
  const transaction = IDBDatabase.prototype.transaction;
  self.__diskFull = true;
  self.__refusedWrites = 0;
  IDBDatabase.prototype.transaction = function (names, mode, options) {
    const tx = transaction.call(this, names, mode, options);
    if (mode === 'readwrite' && self.__diskFull) {
      self.__refusedWrites += 1;
      queueMicrotask(() => tx.abort());
    }
    return tx;
  };
})()`;

/**
 * Evaluates `expression` in the extension's content-script world (its isolated
 * world) inside `page`, so `chrome.runtime` messages there have a real content
 * script sender (tab set, url = the page). The world exists once the engine
 * injected its content script; pass `ensureWorld` (an extension page with the
 * scripting permission) to create it when missing.
 */
export async function evaluateInContentScriptWorld(page, extensionId, expression, { ensureWorld = null, timeout = 30000 } = {}) {
  const context = page.context();
  const session = await context.newCDPSession(page);
  try {
    const worlds = [];
    session.on('Runtime.executionContextCreated', (event) => worlds.push(event.context));
    await session.send('Runtime.enable');
    const origin = `chrome-extension://${extensionId}`;
    const findWorld = () => worlds.filter((world) => world.origin === origin && world.auxData?.isDefault === false).at(-1);
    let world = await waitFor(findWorld, { timeout: 3000, message: 'the extension content-script world' }).catch(() => null);
    if (!world && ensureWorld) {
      const pageUrl = page.url();
      await ensureWorld.evaluate(async (url) => {
        const tabs = await chrome.tabs.query({});
        const tab = tabs.find((candidate) => candidate.url === url);
        if (!tab) throw new Error(`no tab with url ${url} visible to the extension`);
        await chrome.scripting.executeScript({ target: { tabId: tab.id }, func: () => true });
      }, pageUrl);
      world = await waitFor(findWorld, { timeout, message: 'the extension content-script world after executeScript' });
    }
    if (!world) throw new Error('the extension has no content-script world in this page (content script never injected)');
    const { result, exceptionDetails } = await session.send('Runtime.evaluate', {
      contextId: world.id,
      expression,
      awaitPromise: true,
      returnByValue: true,
    });
    if (exceptionDetails) {
      throw new Error(`content-script evaluation failed: ${exceptionDetails.exception?.description ?? exceptionDetails.text}`);
    }
    return result.value;
  } finally {
    await session.detach().catch(() => {});
  }
}

/**
 * Settings' list of MCP servers as the panel shows it (Settings opened if
 * closed): each entry's name, state, who added it, its text and the labels
 * of its Remove, Check again and Sign in/out buttons (null when absent).
 */
export async function shownMcpServers(panel) {
  if (await panel.locator('#settings-section').isHidden()) await panel.click('#settings-toggle');
  return panel.evaluate(() => [...document.querySelectorAll('#mcp-servers-list li')].map((li) => ({
    name: li.dataset.server,
    state: li.dataset.state,
    addedBy: li.dataset.addedBy,
    text: (li.querySelector('.mcp-info') ?? li).innerText.replace(/\s+/g, ' ').trim(),
    remove: li.querySelector('button.mcp-remove')?.getAttribute('aria-label') ?? null,
    refresh: li.querySelector('button.mcp-refresh')?.textContent ?? null,
    sign: li.querySelector('button.mcp-sign')?.textContent ?? null,
  })));
}
