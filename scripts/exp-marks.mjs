import { launchBench } from './bench/browser.mjs';
import { prepareColdStarts } from './bench/cold.mjs';
import { pageColdConnect, swWaitForEngine, swTiming } from './bench/inpage.mjs';
import { seededThread } from './bench/seed.mjs';
import { median } from './bench/stats.mjs';
import { option } from './bench/args.mjs';
const b = await launchBench({ extensionPath: option('--ext', '/tmp/exp') });
try {
  const s = seededThread('exp-1', 1000);
  const page = await prepareColdStarts(b.context, b.real, s);
  const rows = [];
  for (let i = 0; i < 12; i++) {
    await b.real.kill();
    const r = await page.evaluate(pageColdConnect, { threadId: s.thread.id });
    await b.real.evaluate(swWaitForEngine);
    const t = await b.real.evaluate(swTiming);
    const m = await b.real.evaluate(() => globalThis.__marks ?? {});
    rows.push({ ms: r.ms, script: t.scriptAt, ...m, connect: t.firstConnectAt, message: t.firstMessageAt, wasm: t.wasmAt, prefetch: t.prefetchAt, ready: t.readyAt, startMs: t.startMs });
  }
  const keys = Object.keys(rows[0]);
  for (const k of keys) console.log(k.padEnd(10), median(rows.slice(2).map((r) => r[k]).filter((x) => typeof x === 'number')).toFixed(1));
} finally { await b.close(); }
