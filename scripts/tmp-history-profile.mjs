import { startMockLlm } from '../tests/mock-llm/server.mjs';
import { DEFAULT_EXTENSION_PATH } from '../tests/support/browser.mjs';
import { startStaticServer } from '../tests/support/static-server.mjs';
import { launchBench, openClientPage, profileWorker } from './bench/browser.mjs';
import { installClient, pageConfigure, pageOpen, pageRunTurn, swSeed, swWaitForEngine } from './bench/inpage.mjs';
import { ENGINE_DB, seededThread, snapshotStepsScript } from './bench/seed.mjs';

const mock = await startMockLlm({ quiet: true });
const pages = await startStaticServer();
const b = await launchBench({ extensionPath: DEFAULT_EXTENSION_PATH });
try {
  const { context } = b;
  const shop = context.pages()[0] ?? (await context.newPage());
  await shop.goto(pages.url('shop.html'));
  const tag = Date.now().toString(36);
  const threads = [10, 10000].map((length) => ({ length, ...seededThread(`prof-${length}-${tag}`, length) }));
  const handle = b.real;
  const page = await openClientPage(context, handle);
  await page.evaluate(installClient);
  await page.evaluate(pageConfigure, { baseUrl: mock.url, model: 'mock-1', apiKey: 'sk-bench-not-a-secret' });
  await handle.evaluate(swWaitForEngine);
  await handle.evaluate(swSeed, { dbName: ENGINE_DB, threads: threads.map(({ thread, nodes }) => ({ thread, nodes })) });
  await handle.kill();
  await page.evaluate(pageOpen, { key: 'main', threadId: null });
  await shop.bringToFront();
  for (const t of [...threads, ...threads]) {
    await page.evaluate(pageOpen, { key: 'main', threadId: t.thread.id });
    mock.reset();
    mock.setScript(snapshotStepsScript(10));
    const { profile } = await profileWorker(handle, () => page.evaluate(pageRunTurn, { key: 'main', threadId: t.thread.id, text: 'Take 10 page outlines.' }));
    console.log(`--- ${t.length} nodes: busy ${profile.busyMs.toFixed(1)} ms`, JSON.stringify(Object.fromEntries(Object.entries(profile.categories).map(([k, v]) => [k, +v.toFixed(1)]))));
    for (const f of profile.top) console.log(`   ${f.ms.toFixed(2).padStart(8)}  ${f.name.slice(0, 150)}`);
  }
} finally {
  await b.close();
  await mock.close?.();
  await pages.close?.();
}
