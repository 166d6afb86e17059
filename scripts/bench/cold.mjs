// Shared setup of the side-by-side scripts: an extension's client page,
// configured, with seeded threads in the engine's database, ready to be
// killed and cold-connected (bench-cold-ab.mjs, bench-cold-profile.mjs,
// bench-cache-ab.mjs), or to run turns against the mock LLM
// (bench-growth-ab.mjs, bench-step-profile.mjs).

import { openClientPage } from './browser.mjs';
import { installClient, pageConfigure, pageOpen, swSeed, swWaitForEngine } from './inpage.mjs';
import { ENGINE_DB } from './seed.mjs';

/** Opens `handle`'s client page, configures the provider, seeds `seeded` ({ thread, nodes }); returns the page. */
export async function prepareColdStarts(context, handle, seeded) {
  const page = await openClientPage(context, handle);
  await page.evaluate(installClient);
  await page.evaluate(pageConfigure, { baseUrl: 'http://127.0.0.1:9', model: 'mock-1', apiKey: 'sk-bench-not-a-secret' });
  await handle.evaluate(swWaitForEngine);
  await handle.evaluate(swSeed, { dbName: ENGINE_DB, threads: [{ thread: seeded.thread, nodes: seeded.nodes }] });
  return page;
}

/**
 * Opens `handle`'s client page, configures the provider at `baseUrl` (the
 * mock LLM), seeds `threads` ([{ thread, nodes }]) and restarts the worker
 * so the engine knows them; returns the page, its port open.
 */
export async function prepareTurns(context, handle, { baseUrl, threads }) {
  const page = await openClientPage(context, handle);
  await page.evaluate(installClient);
  await page.evaluate(pageConfigure, { baseUrl, model: 'mock-1', apiKey: 'sk-bench-not-a-secret' });
  await handle.evaluate(swWaitForEngine);
  await handle.evaluate(swSeed, { dbName: ENGINE_DB, threads });
  // The engine learns of seeded threads when a fresh worker starts.
  await handle.kill();
  await page.evaluate(pageOpen, { key: 'main', threadId: null });
  return page;
}
