// A Subscribe button whose click does not return until the test says so.
//
// The handler counts the click first (window.subscribeClicks and
// <body data-subscribe-clicks>, like shop.js), then makes a synchronous
// request to the static server's gate `subscribe-click`. While the test keeps
// that gate closed, the page's main thread (and with it the content script's
// `element.click()`, which runs this handler synchronously) stays blocked, so
// the click tool has no result yet: a deterministic "write in flight". The
// gate's arrival tells the test the click happened; it can then kill the
// service worker and open the gate. Served by anything else than the test
// server (no gate), the request fails at once and the click simply returns.
window.subscribeClicks = 0;

const status = document.getElementById('subscribe-status');
document.getElementById('subscribe').addEventListener('click', () => {
  window.subscribeClicks += 1;
  document.body.dataset.subscribeClicks = String(window.subscribeClicks);
  try {
    const request = new XMLHttpRequest();
    request.open('GET', `/__gate/subscribe-click?click=${window.subscribeClicks}`, false);
    request.send();
  } catch {
    // No gate to wait for.
  }
  status.textContent = `Subscribed! (${window.subscribeClicks})`;
});
