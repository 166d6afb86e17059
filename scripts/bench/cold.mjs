// Shared setup of the cold-start scripts (bench-cold-ab.mjs,
// bench-cold-profile.mjs): an extension's client page, configured, with a
// seeded thread in the engine's database, ready to be killed and
// cold-connected.

import { openClientPage } from './browser.mjs';
import { installClient, pageConfigure, swSeed, swWaitForEngine } from './inpage.mjs';
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
