// End-to-end tests of the browser tools through the real extension: the built
// extension (dist/extension) in headless Chromium, the mock LLM scripted over
// its control API (POST /__control/script with `toolCalls` steps) and the
// local test pages. The model "calls" page_snapshot, type, select, scroll,
// wait_for, navigate, go_back, list_tabs and switch_tab; every write asks in
// the side panel's approval card and the test answers there, like a user.
// The tests check the real effect on the page and the tool results the model
// received (the mock's recorded requests).
//
// Run:  node tests/e2e/tools.mjs            (after `make build`)
//       node --test-name-pattern=wait_for tests/e2e/tools.mjs   (one test)
// On failure: target/e2e/<test>.png and <test>.txt (see tests/support/session.mjs).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  DEFAULT_EXTENSION_PATH,
  assertExtensionBuilt,
  portLog,
  readApprovalCard,
  submitTask,
  transcriptLines,
  waitFor,
  answerApprovalInPanel,
  approvalHistory,
} from '../support/browser.mjs';
import { startSession, waitForSettledTurn, topLevelNodes, toolCards, orphanToolCallProblems, saveArtifacts, isolatedTest as sharedIsolatedTest } from '../support/session.mjs';

try {
  assertExtensionBuilt(DEFAULT_EXTENSION_PATH);
} catch (error) {
  process.stderr.write(`e2e: ${error.message}\n`);
  process.exit(1);
}

const TEST_TIMEOUT = 300000;
const FORM_PAGE = 'form.html';

/** A test with its own fresh session (see tests/support/session.mjs). */
function isolatedTest(name, options, body) {
  sharedIsolatedTest(test, name, options, body, { timeout: TEST_TIMEOUT });
}

/** Replaces the mock's queue of responses through its HTTP control API. */
async function scriptModel(mock, steps) {
  const response = await fetch(`${mock.origin}/__control/script`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ steps }),
  });
  const body = await response.text();
  assert.equal(response.status, 200, `POST /__control/script: ${body}`);
  assert.equal(JSON.parse(body).pendingSteps, steps.length);
}

const call = (name, args = {}, text = undefined) => ({ ...(text ? { text } : {}), toolCalls: [{ name, arguments: args }] });

function messageText(message) {
  const content = message?.content;
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((part) => (typeof part === 'string' ? part : part?.text ?? '')).join('');
  return '';
}

/** Every tool call the model made in the conversation of `request`, with the result it got back. */
function toolExchanges(request) {
  const messages = request.body?.messages ?? [];
  const out = [];
  for (const message of messages) {
    if (message.role !== 'assistant' || !Array.isArray(message.tool_calls)) continue;
    for (const toolCall of message.tool_calls) {
      const result = messages.find((m) => m.role === 'tool' && m.tool_call_id === toolCall.id);
      out.push({
        id: toolCall.id,
        name: toolCall.function?.name,
        args: JSON.parse(toolCall.function?.arguments || '{}'),
        content: result ? messageText(result) : null,
      });
    }
  }
  return out;
}

/** The page's own text inside the engine's untrusted-content delimiters (asserts they are there). */
function pageContent(content, origin) {
  const open = `<untrusted_page_content origin="${origin}">\n`;
  assert.ok(content.startsWith(open), `delimited page content from ${origin}: ${content.slice(0, 160)}`);
  const close = content.lastIndexOf('\n</untrusted_page_content>');
  assert.ok(close > 0, 'the delimiter is closed');
  return content.slice(open.length, close);
}

/** The text of a tool result without the untrusted-content delimiters, if it has them. */
function unwrap(content) {
  const match = /^(Error: )?<untrusted_page_content origin="[^"]*">\n([\s\S]*)\n<\/untrusted_page_content>\n[^\n]*$/.exec(content);
  return match ? `${match[1] ?? ''}${match[2]}` : content;
}

/** The ref of the first snapshot line matching `pattern`. */
function refOf(snapshot, pattern) {
  const line = snapshot.split('\n').find((l) => /\[e\d+\]/.test(l) && pattern.test(l));
  assert.ok(line, `no snapshot line matches ${pattern}:\n${snapshot}`);
  return /\[(e\d+)\]/.exec(line)[1];
}

function describeState(panelState) {
  return `state=${panelState.state}\n${transcriptLines(panelState).join('\n')}`;
}

function assertNoOrphans(session) {
  assert.deepEqual(orphanToolCallProblems(session.mock.requests()), [], 'no_orphan_tool_calls on every provider request');
}

/** All tabs as the extension sees them. */
async function tabs(panel) {
  return panel.evaluate(async () => (await chrome.tabs.query({})).map((t) => ({ id: t.id, url: t.url, title: t.title, active: t.active })));
}

/** Submits a task, answers the approvals of `approvals` (tool names, in order) with "Allow once", waits for the run to settle. */
async function runTurn(session, task, { approvals = [], previousTurnId = '' } = {}) {
  const { panel } = session;
  await submitTask(panel, task);
  const cards = [];
  for (const expected of approvals) {
    const card = await answerApprovalInPanel(panel, 'acceptOnce');
    assert.equal(card.toolName, expected, `the approval card asks about ${expected}`);
    cards.push(card);
  }
  const final = await waitForSettledTurn(panel, { previousTurnId });
  assert.equal(final.state, 'completed', describeState(final));
  return { final, cards };
}

isolatedTest('page_tools_snapshot_type_select_scroll_wait_for_and_tab_tools', { page: FORM_PAGE }, async (session) => {
  const { panel, shop: form, mock, pages, context } = session;

  // ---- Turn 1: the model looks at the page.
  await scriptModel(mock, [call('page_snapshot', {}, 'Let me look at the page.'), { text: 'I see a contact form.' }]);
  const first = await runTurn(session, 'Look at the contact form');
  assert.deepEqual(toolCards(first.final).map((c) => [c.toolName, c.status]), [['page_snapshot', 'ok']], describeState(first.final));
  const snapshotExchange = toolExchanges(mock.requests()[1]).find((e) => e.name === 'page_snapshot');
  const snapshot = pageContent(snapshotExchange.content, pages.origin);
  assert.match(snapshot, /^Title: Acme contact form\nURL: http:\/\/127\.0\.0\.1:\d+\/form\.html\nScroll: 0 of \d+ px \(viewport 800 px\)\n/);
  assert.match(snapshot, /^banner\n {2}h1 "Acme account"\n {2}navigation "Main"\n {4}list\n {6}\[e\d+\] link "Home"$/m);
  assert.match(snapshot, /^ {2}form "Contact form"$/m);
  assert.match(snapshot, /^ {4}\[e\d+\] textbox "Full name" required$/m);
  assert.match(snapshot, /^ {4}\[e\d+\] textbox "Password" type=password value=\(hidden\)$/m);
  assert.match(snapshot, /^ {4}\[e\d+\] button "Shadow action"$/m, 'open shadow roots are included');
  assert.match(snapshot, /^ {6}\[e\d+\] button "Frame button"$/m, 'same-origin frames are included');
  assert.doesNotMatch(snapshot, /hunter2|Ghost action/, 'no password value, nothing aria-hidden');
  const nameRef = refOf(snapshot, /textbox "Full name"/);
  const countryRef = refOf(snapshot, /combobox "Country"/);
  // The panel renders the snapshot as page content.
  const snapshotCard = toolCards(first.final).find((c) => c.toolName === 'page_snapshot');
  assert.match(snapshotCard.results[0].text, /form "Contact form"/);

  // ---- Turn 2: type, select, scroll, wait_for (type and select ask first).
  await scriptModel(mock, [
    call('type', { ref: nameRef, text: 'Ada Lovelace' }, 'I will type the name.'),
    call('select', { ref: countryRef, option: 'france' }),
    call('scroll', { direction: 'down' }),
    call('wait_for', { text: 'Hello, Ada Lovelace!', timeout_ms: 10000 }),
    { text: 'Filled in the form.' },
  ]);
  const requestsBefore = mock.requests().length;
  const second = await runTurn(session, 'Fill in the form: Ada Lovelace from France', {
    approvals: ['type', 'select'],
    previousTurnId: first.final.turnId,
  });
  const [typeCard, selectCard] = second.cards;
  assert.deepEqual(typeCard.params, { ref: nameRef, text: 'Ada Lovelace' });
  assert.equal(typeCard.origin, pages.origin);
  assert.deepEqual(selectCard.params, { ref: countryRef, option: 'france' });

  // The page: values set so that a framework noticed, option chosen, scrolled, greeting shown.
  assert.equal(await form.inputValue('#name'), 'Ada Lovelace');
  assert.deepEqual(await form.evaluate(() => window.reactChanges), ['Ada Lovelace'], 'the React-like value tracker reported the change');
  const nameEvents = await form.evaluate(() => window.eventLog.filter((e) => e.id === 'name' && (e.type === 'input' || e.type === 'change')));
  assert.deepEqual(nameEvents.map((e) => [e.type, e.value]), [['input', 'Ada Lovelace'], ['change', 'Ada Lovelace']]);
  assert.equal(await form.inputValue('#country'), 'fr');
  assert.deepEqual(
    await form.evaluate(() => window.eventLog.filter((e) => e.id === 'country' && (e.type === 'input' || e.type === 'change')).map((e) => [e.type, e.value])),
    [['input', 'fr'], ['change', 'fr']],
  );
  // type/select scrolled their fields into view first (a little); scroll then moved one viewport.
  const scrollY = await form.evaluate(() => window.scrollY);
  assert.ok(scrollY >= 800 && scrollY < 1100, `scrolled down by one viewport from near the top: ${scrollY}`);
  assert.equal(await form.textContent('#greeting'), 'Hello, Ada Lovelace!');

  // What the model received.
  const requests = mock.requests();
  assert.equal(requests.length - requestsBefore, 5, 'type, select, scroll, wait_for, final answer');
  const results = Object.fromEntries(toolExchanges(requests.at(-1)).map((e) => [e.name, e]));
  const height = await form.evaluate(() => document.scrollingElement.scrollHeight);
  assert.equal(pageContent(results.type.content, pages.origin), `Typed "Ada Lovelace" into textbox "Full name" (${nameRef}).`);
  assert.equal(pageContent(results.select.content, pages.origin), `Chose "France" in combobox "Country" (${countryRef}).`);
  assert.equal(pageContent(results.scroll.content, pages.origin), `Scrolled down: now at ${scrollY} of ${height} px (viewport 800 px).`);
  assert.match(
    pageContent(results.wait_for.content, pages.origin),
    /^The text "Hello, Ada Lovelace!" (appeared after \d+\.\d s|is already visible)\.$/,
  );
  const cards = toolCards(second.final).slice(-4);
  assert.deepEqual(cards.map((c) => c.callId), ['type', 'select', 'scroll', 'wait_for'].map((name) => results[name].id));
  assert.deepEqual(cards.map((c) => [c.toolName, c.status]), [['type', 'ok'], ['select', 'ok'], ['scroll', 'ok'], ['wait_for', 'ok']], describeState(second.final));
  assert.match(topLevelNodes(second.final).at(-1).text, /Filled in the form\./);

  // ---- Turn 3: navigate, go_back (both ask), list_tabs, switch_tab, then a snapshot of the other tab.
  const other = await context.newPage();
  await other.goto(pages.url('shop.html'));
  await form.bringToFront();
  const before = await tabs(panel);
  const formTab = before.find((t) => t.url === form.url());
  const otherTab = before.find((t) => t.url === other.url());
  assert.ok(formTab?.active && otherTab && !otherTab.active, `the form tab is active: ${JSON.stringify(before)}`);
  await scriptModel(mock, [
    call('navigate', { url: pages.url('archive.html') }, 'Opening the archive.'),
    call('go_back'),
    call('list_tabs'),
    call('switch_tab', { tab_id: otherTab.id }),
    call('page_snapshot'),
    { text: 'Switched to the newsletter tab.' },
  ]);
  const requestsBeforeTabs = mock.requests().length;
  const third = await runTurn(session, 'Visit the archive, come back, then switch to the newsletter tab', {
    approvals: ['navigate', 'go_back'],
    previousTurnId: second.final.turnId,
  });
  assert.deepEqual(third.cards[0].params, { url: pages.url('archive.html') });
  assert.equal(mock.requests().length - requestsBeforeTabs, 6);
  const tabResults = toolExchanges(mock.requests().at(-1)).slice(-5);
  assert.deepEqual(tabResults.map((e) => e.name), ['navigate', 'go_back', 'list_tabs', 'switch_tab', 'page_snapshot']);
  const [navigate, goBack, listTabs, switchTab] = tabResults.map((e) => ({ ...e, content: unwrap(e.content) }));
  const otherSnapshot = tabResults[4];
  assert.match(navigate.content, new RegExp(`^Loaded: "Newsletter archive" ${pages.url('archive.html').replace(/[.]/g, '\\.')}\\. Call page_snapshot to see it\\.`));
  assert.match(goBack.content, new RegExp(`^Went back to: "Acme contact form" ${pages.url('form.html').replace(/[.]/g, '\\.')}\\.`));
  assert.match(listTabs.content, /^\d+ open tabs:/);
  assert.ok(listTabs.content.includes(`[${formTab.id}] (active) "Acme contact form" ${pages.url('form.html')}`), listTabs.content);
  assert.ok(listTabs.content.includes(`[${otherTab.id}] "Acme Newsletter" ${pages.url('shop.html')}`), listTabs.content);
  assert.ok(!listTabs.content.includes('chrome-extension://'), 'the panel tab is not listed');
  assert.equal(switchTab.content, `Switched to tab ${otherTab.id}: "Acme Newsletter" ${pages.url('shop.html')}.`);
  const switched = pageContent(otherSnapshot.content, pages.origin);
  assert.match(switched, /^Title: Acme Newsletter\n/, 'later page tools act on the switched-to tab');
  assert.match(switched, /\[e\d+\] button "Subscribe"/);
  assert.equal(form.url(), pages.url('form.html'), 'go_back returned to the form');
  const after = await tabs(panel);
  assert.equal(after.find((t) => t.id === otherTab.id)?.active, true, 'the other tab is active now');
  assert.deepEqual(
    toolCards(third.final).slice(-5).map((c) => [c.toolName, c.status]),
    [['navigate', 'ok'], ['go_back', 'ok'], ['list_tabs', 'ok'], ['switch_tab', 'ok'], ['page_snapshot', 'ok']],
    describeState(third.final),
  );

  // Every write asked once, and only the writes.
  const history = await approvalHistory(panel);
  assert.deepEqual(history.map((a) => [a.toolName, a.status]), [
    ['type', 'accepted_once'],
    ['select', 'accepted_once'],
    ['navigate', 'accepted_once'],
    ['go_back', 'accepted_once'],
  ]);
  assert.equal((await readApprovalCard(panel)).visible, false);
  assertNoOrphans(session);
});

isolatedTest('wait_for_interrupted_by_navigation_is_a_clear_tool_error', { page: FORM_PAGE }, async (session) => {
  const { panel, shop: form, mock, pages } = session;
  await scriptModel(mock, [
    call('wait_for', { text: 'This never appears', timeout_ms: 25000 }, 'Waiting for the confirmation.'),
    { text: 'The page changed while I was waiting.' },
  ]);
  await submitTask(panel, 'Wait for the confirmation');
  // The content script reports progress every second; navigate once it is waiting.
  const progress = await waitFor(
    async () => {
      const log = (await portLog(panel)) ?? [];
      return log
        .filter((entry) => entry.dir === 'in' && entry.json)
        .map((entry) => JSON.parse(entry.json))
        .find((m) => m.type === 'item.delta' && m.delta?.kind === 'toolProgress');
    },
    { timeout: 60000, interval: 100, message: 'a tool progress event of wait_for' },
  );
  assert.match(progress.delta.text, /^waiting… 1 s \(for the text "This never appears"\)$/);
  await form.evaluate(() => {
    location.href = 'archive.html';
  });
  const final = await waitForSettledTurn(panel);
  assert.equal(final.state, 'completed', `the run continues after the tool error\n${describeState(final)}`);
  assert.equal(form.url(), pages.url('archive.html'));

  const requests = mock.requests();
  assert.equal(requests.length, 2, 'wait_for, then the final answer');
  const exchange = toolExchanges(requests[1]).find((e) => e.name === 'wait_for');
  // The content script's own last words (sent from `pagehide`), not only the engine's port-closed fallback.
  // (Whether the engine wraps a failed page tool's message as untrusted page content has changed over
  // time; both forms are accepted.)
  assert.match(
    unwrap(exchange.content),
    /^(Error: )?The page navigated away \(or was closed\) while waiting for the text "This never appears"; nothing was found\. Call page_snapshot/,
    `a clear error: ${exchange.content}`,
  );
  const card = toolCards(final).find((c) => c.toolName === 'wait_for');
  assert.equal(card.status, 'error', describeState(final));
  assert.match(card.results[0].text, /navigated away/i);
  assert.match(topLevelNodes(final).at(-1).text, /The page changed while I was waiting\./);
  assertNoOrphans(session);
});

isolatedTest('browser_page_cannot_be_automated', { page: FORM_PAGE }, async (session) => {
  const { panel, shop: tab, mock } = session;
  await tab.goto('chrome://version');
  await tab.bringToFront();
  await scriptModel(mock, [
    call('page_snapshot', {}, 'Let me look.'),
    call('type', { ref: 'e1', text: 'hello' }),
    { text: 'I cannot work on this page.' },
  ]);
  await submitTask(panel, 'Read this page');
  const final = await waitForSettledTurn(panel);
  assert.equal(final.state, 'completed', describeState(final));
  const requests = mock.requests();
  assert.equal(requests.length, 3);
  const results = toolExchanges(requests[2]);
  assert.deepEqual(results.map((e) => e.name), ['page_snapshot', 'type']);
  for (const result of results) {
    assert.match(result.content, /Chrome does not let extensions act on chrome:\/\/version\/ .*Ask the user to open a normal web page\./, result.name);
  }
  assert.equal((await approvalHistory(panel)).length, 0, 'a write on a forbidden page is refused without asking');
  const cards = toolCards(final);
  assert.deepEqual(cards.map((c) => c.toolName), ['page_snapshot', 'type']);
  for (const card of cards) {
    assert.notEqual(card.status, 'ok', describeState(final));
    assert.match(card.results[0].text, /does not let extensions act on chrome:\/\/version/);
  }
  assertNoOrphans(session);
});
