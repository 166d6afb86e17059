// Counts clicks so tests can assert that a never-retry page action happened
// exactly once (window.subscribeClicks and <body data-subscribe-clicks>).
window.subscribeClicks = 0;
window.unsubscribeClicks = 0;
window.contactClicks = 0;

function track(buttonId, counterName, datasetKey, onClick) {
  document.getElementById(buttonId).addEventListener('click', () => {
    window[counterName] += 1;
    document.body.dataset[datasetKey] = String(window[counterName]);
    if (onClick) onClick(window[counterName]);
  });
}

const status = document.getElementById('subscribe-status');
track('subscribe', 'subscribeClicks', 'subscribeClicks', (n) => {
  status.textContent = `Subscribed! (${n})`;
});
track('unsubscribe', 'unsubscribeClicks', 'unsubscribeClicks', (n) => {
  status.textContent = `Unsubscribed. (${n})`;
});
track('contact', 'contactClicks', 'contactClicks', () => {
  status.textContent = 'Write to us at letters@acme.example.';
});
