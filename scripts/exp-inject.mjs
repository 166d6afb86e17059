import { launchBench } from './bench/browser.mjs';
import { startStaticServer } from '../tests/support/static-server.mjs';
import { swWaitForEngine } from './bench/inpage.mjs';
import { median } from './bench/stats.mjs';
const pages = await startStaticServer();
const b = await launchBench({ extensionPath: 'dist/extension' });
try {
  const shop = b.context.pages()[0] ?? (await b.context.newPage());
  await shop.goto(pages.url('shop.html'));
  await b.real.evaluate(swWaitForEngine);
  const r = await b.real.evaluate(async () => {
    const [tab] = await chrome.tabs.query({ active: true, lastFocusedWindow: true });
    const inj = [], q = [], g = [], conn = [];
    for (let i = 0; i < 25; i++) {
      let t = performance.now();
      await chrome.scripting.executeScript({ target: { tabId: tab.id, frameIds: [0] }, files: ['content/content.js'] });
      inj.push(performance.now() - t);
      t = performance.now();
      await chrome.tabs.query({ active: true, lastFocusedWindow: true });
      q.push(performance.now() - t);
      t = performance.now();
      await chrome.tabs.get(tab.id);
      g.push(performance.now() - t);
      t = performance.now();
      await new Promise((resolve) => {
        const p = chrome.tabs.connect(tab.id, { name: 'page', frameId: 0 });
        p.onMessage.addListener(() => { p.disconnect(); resolve(); });
        p.onDisconnect.addListener(() => resolve());
        p.postMessage({ type: 'tool.execute', callId: 'x' + i, name: 'no_such_tool', params: {}, frameId: 0 });
      });
      conn.push(performance.now() - t);
    }
    return { inj, q, g, conn };
  });
  for (const [k, v] of Object.entries(r)) console.log(k, median(v.slice(3)).toFixed(2), Math.min(...v).toFixed(2), Math.max(...v).toFixed(2));
} finally { await b.close(); pages.close?.(); }
