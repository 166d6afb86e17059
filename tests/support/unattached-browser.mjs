// Chromium with the extension and nothing attached to its service worker, for
// the tests of the worker's own lifetime (tests/e2e/lifetime.mjs).
//
// Why not playwright-core: Playwright attaches DevTools to every service
// worker of its context, and Chrome never stops a worker that DevTools is
// attached to, so under Playwright an idle worker runs forever and a test
// cannot see Chrome stop it (measured here: an idle worker under Playwright
// ran 75 s with no panel; the same build launched as below was stopped 27 s
// after its last event). This harness speaks CDP over `--remote-debugging-pipe`
// itself and attaches only to pages, and to the worker only for a moment
// when a test asks to (`inWorker`, which detaches again).
//
// Owns: launching Chromium with the unpacked extension in a fresh temp
// profile, the worker's running status as Chrome reports it (ServiceWorker
// domain, observed from an about:blank page), pages it opens and evaluates
// in, killing the worker (Target.closeTarget), reading the extension's
// IndexedDB from an extension page that opens no Port.
// Must not: download a browser, touch anything outside its temp profile, or
// use fixed sleeps for correctness (everything waits on a condition).

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { CHROMIUM_PATH, DEFAULT_EXTENSION_PATH, PANEL_PATH, assertExtensionBuilt, waitFor } from './browser.mjs';

/**
 * Launches headless Chromium with the extension, over a CDP pipe.
 * @returns {Promise<UnattachedBrowser>}
 */
export async function launchUnattached({ extensionPath = DEFAULT_EXTENSION_PATH } = {}) {
  const extension = path.resolve(extensionPath);
  assertExtensionBuilt(extension);
  const userDataDir = mkdtempSync(path.join(os.tmpdir(), 'agent-ext-unattached-'));
  const child = spawn(
    CHROMIUM_PATH,
    [
      '--headless',
      '--no-sandbox',
      '--remote-debugging-pipe',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
      `--user-data-dir=${userDataDir}`,
      `--disable-extensions-except=${extension}`,
      `--load-extension=${extension}`,
      'about:blank',
    ],
    { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] },
  );
  const browser = new UnattachedBrowser(child, userDataDir);
  try {
    await browser.start();
  } catch (error) {
    await browser.close();
    throw error;
  }
  return browser;
}

export class UnattachedBrowser {
  constructor(child, userDataDir) {
    this.child = child;
    this.userDataDir = userDataDir;
    this.nextId = 0;
    this.pending = new Map();
    this.buffer = '';
    this.stderr = '';
    /** Every running-status change of the extension's worker: { status, at }. */
    this.workerLog = [];
    this.extensionId = null;
    this.exited = false;
    child.stdio[2].on('data', (chunk) => {
      this.stderr = (this.stderr + chunk.toString()).slice(-20000);
    });
    child.stdio[4].on('data', (chunk) => this.receive(chunk));
    child.on('exit', () => {
      this.exited = true;
      for (const { reject, method } of this.pending.values()) reject(new Error(`Chromium exited during ${method}`));
      this.pending.clear();
    });
  }

  receive(chunk) {
    this.buffer += chunk.toString();
    for (let end = this.buffer.indexOf('\0'); end >= 0; end = this.buffer.indexOf('\0')) {
      const message = JSON.parse(this.buffer.slice(0, end));
      this.buffer = this.buffer.slice(end + 1);
      const waiting = message.id !== undefined ? this.pending.get(message.id) : undefined;
      if (waiting) {
        this.pending.delete(message.id);
        if (message.error) waiting.reject(new Error(`${waiting.method}: ${JSON.stringify(message.error)}`));
        else waiting.resolve(message.result);
      } else if (message.method === 'ServiceWorker.workerVersionUpdated') {
        for (const version of message.params.versions) {
          if (this.extensionId && version.scriptURL.startsWith(`chrome-extension://${this.extensionId}/`)) {
            const last = this.workerLog.at(-1);
            if (last?.status !== version.runningStatus) this.workerLog.push({ status: version.runningStatus, at: Date.now() });
          }
        }
      }
    }
  }

  /** One CDP command (on a page's session when `sessionId` is given). */
  send(method, params = {}, sessionId = undefined) {
    if (this.exited) return Promise.reject(new Error(`Chromium is not running (${method})`));
    const id = ++this.nextId;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.child.stdio[3].write(`${JSON.stringify({ id, method, params, sessionId })}\0`);
    });
  }

  async start() {
    const worker = await waitFor(
      async () => {
        const { targetInfos } = await this.send('Target.getTargets');
        return targetInfos.find((t) => t.type === 'service_worker' && t.url.startsWith('chrome-extension://')) ?? null;
      },
      { timeout: 60000, message: "the extension's service worker to start" },
    );
    this.extensionId = new URL(worker.url).host;
    // The observer: the ServiceWorker domain of an about:blank page reports
    // the worker's status without attaching to the worker.
    const { targetInfos } = await this.send('Target.getTargets');
    const blank = targetInfos.find((t) => t.type === 'page');
    const { sessionId } = await this.send('Target.attachToTarget', { targetId: blank.targetId, flatten: true });
    await this.send('ServiceWorker.enable', {}, sessionId);
    await waitFor(() => this.workerLog.length > 0, { timeout: 30000, message: 'the first worker status' });
  }

  /** The worker's current status: running, starting, stopping or stopped. */
  workerStatus() {
    return this.workerLog.at(-1)?.status ?? 'unknown';
  }

  /** Statuses since `from` (a `workerLog` length). */
  workerStatusesSince(from) {
    return this.workerLog.slice(from).map((entry) => entry.status);
  }

  /**
   * Opens `url` in a new tab and attaches to it.
   * @returns {Promise<{ targetId: string, evaluate: (expression: string) => Promise<any>, close: () => Promise<void> }>}
   */
  async openPage(url) {
    const { targetId } = await this.send('Target.createTarget', { url });
    const { sessionId } = await this.send('Target.attachToTarget', { targetId, flatten: true });
    const evaluate = async (expression) => {
      const { result, exceptionDetails } = await this.send(
        'Runtime.evaluate',
        { expression, awaitPromise: true, returnByValue: true },
        sessionId,
      );
      if (exceptionDetails) {
        throw new Error(`evaluate in ${url}: ${exceptionDetails.exception?.description ?? exceptionDetails.text}`);
      }
      return result.value;
    };
    // The new tab's first document is about:blank, itself "complete" (and
    // with a `chrome` object, without the extension's APIs): wait for `url`.
    const loaded = `location.href === ${JSON.stringify(url)} && document.readyState === "complete"`;
    await waitFor(() => evaluate(loaded).catch(() => false), {
      timeout: 30000,
      message: `${url} to load`,
    });
    return { targetId, evaluate, close: () => this.send('Target.closeTarget', { targetId }).then(() => {}) };
  }

  /**
   * An extension page that opens no Port (the manifest, shown as text): it
   * reads chrome.storage and IndexedDB with the extension's origin without
   * waking or keeping the worker.
   */
  extensionPage() {
    return this.openPage(`chrome-extension://${this.extensionId}/manifest.json`);
  }

  /** Opens the side panel page as a tab and waits for its first snapshot. */
  async openPanel() {
    const panel = await this.openPage(`chrome-extension://${this.extensionId}/${PANEL_PATH}`);
    await waitFor(() => panel.evaluate('document.body?.dataset.ready === "true"'), {
      timeout: 60000,
      message: 'the side panel to render its first snapshot',
    });
    return panel;
  }

  /** The extension's running worker target; throws (naming `purpose`) when none runs. */
  async workerTarget(purpose) {
    const { targetInfos } = await this.send('Target.getTargets');
    const worker = targetInfos.find((t) => t.type === 'service_worker' && t.url.startsWith(`chrome-extension://${this.extensionId}/`));
    if (!worker) throw new Error(`no running service worker to ${purpose}`);
    return worker;
  }

  /**
   * Evaluates `expression` in the worker: attaches, evaluates, detaches. While
   * attached Chrome does not stop the worker; after this returns it may again.
   */
  async inWorker(expression) {
    const worker = await this.workerTarget('evaluate in');
    const { sessionId } = await this.send('Target.attachToTarget', { targetId: worker.targetId, flatten: true });
    try {
      const { result, exceptionDetails } = await this.send(
        'Runtime.evaluate',
        { expression, awaitPromise: true, returnByValue: true },
        sessionId,
      );
      if (exceptionDetails) throw new Error(`evaluate in the worker: ${exceptionDetails.exception?.description ?? exceptionDetails.text}`);
      return result.value;
    } finally {
      await this.send('Target.detachFromTarget', { sessionId }).catch(() => {});
    }
  }

  /** Kills the worker (Target.closeTarget) and waits until Chrome reports it stopped. */
  async killWorker() {
    const worker = await this.workerTarget('kill');
    const from = this.workerLog.length;
    await this.send('Target.closeTarget', { targetId: worker.targetId });
    await this.waitForWorkerStop(from, 'the killed worker to be reported stopped', { timeout: 30000, interval: 20 });
  }

  /**
   * Waits until Chrome reports the worker stopped after `from` (a
   * `workerLog` length). The default timeout is Chrome's 30 s idle timeout
   * with a wide margin for a loaded machine.
   */
  async waitForWorkerStop(from, message, { timeout = 120000, interval = 200 } = {}) {
    await waitFor(() => this.workerStatusesSince(from).includes('stopped'), { timeout, interval, message });
  }

  async close() {
    if (!this.exited) {
      await this.send('Browser.close').catch(() => {});
      await waitFor(() => this.exited, { timeout: 10000, message: 'Chromium to exit' }).catch(() => this.child.kill('SIGKILL'));
    }
    rmSync(this.userDataDir, { recursive: true, force: true });
  }
}

/**
 * Reads every record of one IndexedDB store of the extension's database,
 * evaluated in an extension page.
 */
export function readStoreExpression(storeName, database = 'sw-agent') {
  return `(async () => {
    const request = (req) => new Promise((resolve, reject) => { req.onsuccess = () => resolve(req.result); req.onerror = () => reject(req.error); });
    const open = indexedDB.open(${JSON.stringify(database)});
    // A database the engine has not created yet must not be created here.
    open.onupgradeneeded = () => open.transaction.abort();
    const db = await request(open).catch(() => null);
    if (!db) return [];
    try {
      if (!db.objectStoreNames.contains(${JSON.stringify(storeName)})) return [];
      return await request(db.transaction(${JSON.stringify(storeName)}, 'readonly').objectStore(${JSON.stringify(storeName)}).getAll());
    } finally {
      db.close();
    }
  })()`;
}
