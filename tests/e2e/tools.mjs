// End-to-end tests of the browser tools through the real extension: the built
// extension (dist/extension) in headless Chromium, the mock LLM scripted over
// its control API (POST /__control/script with `toolCalls` steps) and the
// local test pages. The model "calls" page_snapshot, type, select, scroll,
// wait_for, navigate, go_back, list_tabs, switch_tab and screenshot, and acts
// inside a cross-origin iframe (frame targeting) and inside closed shadow
// roots; every write asks in
// the side panel's approval card and the test answers there, like a user.
// The tests check the real effect on the page and the tool results the model
// received (the mock's recorded requests).
//
// Run:  node tests/e2e/tools.mjs            (after `make build`)
//       node --test-name-pattern=wait_for tests/e2e/tools.mjs   (one test)
// On failure: target/e2e/<test>.png and <test>.txt (see tests/support/session.mjs).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  exitUnlessExtensionBuilt,
  portLog,
  waitForToolProgress,
  readApprovalCard,
  submitTask,
  transcriptLines,
  waitFor,
  answerApprovalInPanel,
  approvalHistory,
  dumpIndexedDb,
  REPO_ROOT,
  waitForApprovalCard,
  waitForExtensionServiceWorker,
  openPanel,
  updateExtension,
} from '../support/browser.mjs';
import {
  startSession,
  waitForSettledTurn,
  topLevelNodes,
  toolCards,
  orphanToolCallProblems,
  saveArtifacts,
  isolatedTest as sharedIsolatedTest,
  messageText,
  scriptModel,
  enableVision,
  subscribeClicks,
} from '../support/session.mjs';

exitUnlessExtensionBuilt('e2e');

const TEST_TIMEOUT = 300000;
const FORM_PAGE = 'form.html';

/** A test with its own fresh session (see tests/support/session.mjs). */
function isolatedTest(name, options, body) {
  sharedIsolatedTest(test, name, options, body, { timeout: TEST_TIMEOUT });
}

const call = (name, args = {}, text = undefined) => ({ ...(text ? { text } : {}), toolCalls: [{ name, arguments: args }] });

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
  // Tab titles and URLs were written by their pages: data for the model, like page text.
  for (const result of tabResults.slice(2, 4)) {
    assert.ok(result.content.startsWith('<untrusted_page_content origin="open tabs">\n'), result.content);
  }
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

// A 204 or a download leaves the tab on the page it showed: the model must
// not be told the new page loaded. A redirect loads, and says where it ended.
isolatedTest('navigate_says_when_the_tab_stayed_on_the_old_page_and_where_a_redirect_ended', { page: FORM_PAGE }, async (session) => {
  const { shop: form, mock, pages } = session;
  const noContent = `${pages.origin}/__no-content`;
  const download = `${pages.origin}/__download/report.txt`;
  const redirect = `${pages.origin}/__redirect/archive.html`;
  await scriptModel(mock, [
    call('navigate', { url: noContent }, 'Opening it.'),
    call('navigate', { url: download }, 'Opening the report.'),
    call('navigate', { url: redirect }, 'Opening the archive.'),
    { text: 'Done.' },
  ]);
  const { final } = await runTurn(session, 'Open those pages', { approvals: ['navigate', 'navigate', 'navigate'] });
  const results = toolExchanges(mock.requests().at(-1)).map((e) => unwrap(e.content));
  assert.equal(results.length, 3, JSON.stringify(results));
  const escape = (text) => text.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
  const formUrl = escape(pages.url('form.html'));
  for (const [result, url] of [[results[0], noContent], [results[1], download]]) {
    assert.match(
      result,
      new RegExp(`^(Error: )?The tab stayed on "Acme contact form" ${formUrl}: opening ${escape(url)} did not show a new page \\(.*204 No Content.*download.*Leave site\\?.*\\)\\. Call page_snapshot to see what it shows now\\.`),
      result,
    );
  }
  assert.match(results[2], new RegExp(`^Loaded: "Newsletter archive" ${escape(pages.url('archive.html'))} \\(redirected from ${escape(redirect)}\\)\\. Call page_snapshot to see it\\.`), results[2]);
  assert.deepEqual(toolCards(final).map((c) => [c.toolName, c.status]), [['navigate', 'error'], ['navigate', 'error'], ['navigate', 'ok']], describeState(final));
  assert.equal(form.url(), pages.url('archive.html'));
  assertNoOrphans(session);
});

isolatedTest('go_back_says_when_the_tab_stayed_on_the_page_and_where_it_went', { page: FORM_PAGE }, async (session) => {
  const { shop: tab, mock, pages } = session;
  await tab.goto(pages.url('archive.html'));
  // The archive asks "Leave site?" (the page was used: a click); the user
  // stays the first time and leaves the second.
  await tab.evaluate(() => window.addEventListener('beforeunload', (event) => { event.preventDefault(); event.returnValue = ''; }));
  await tab.click('body');
  const dialogs = [];
  tab.on('dialog', (dialog) => {
    dialogs.push(dialog.type());
    (dialogs.length === 1 ? dialog.dismiss() : dialog.accept()).catch(() => {});
  });
  await scriptModel(mock, [
    call('go_back', {}, 'Going back.'),
    call('go_back', {}, 'Going back again.'),
    { text: 'Back on the form.' },
  ]);
  const { final } = await runTurn(session, 'Go back to the form', { approvals: ['go_back', 'go_back'] });
  const results = toolExchanges(mock.requests().at(-1)).map((e) => unwrap(e.content));
  const escape = (text) => text.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');
  assert.match(
    results[0],
    new RegExp(`^(Error: )?The tab stayed on "Newsletter archive" ${escape(pages.url('archive.html'))}: going back did not leave it \\(the page may have cancelled leaving or be still asking "Leave site\\?", the earlier page may not have loaded, or the page changed its view in place\\)\\. Call page_snapshot to see what it shows now\\.`),
    results[0],
  );
  assert.match(results[1], new RegExp(`^Went back to: "Acme contact form" ${escape(pages.url('form.html'))}`), results[1]);
  assert.deepEqual(dialogs, ['beforeunload', 'beforeunload']);
  assert.deepEqual(toolCards(final).map((c) => [c.toolName, c.status]), [['go_back', 'error'], ['go_back', 'ok']], describeState(final));
  assert.equal(tab.url(), pages.url('form.html'));
  assertNoOrphans(session);
});

isolatedTest('what_a_server_needs_back_reaches_it_and_a_turn_keeps_its_send_time_note', { page: FORM_PAGE }, async (session) => {
  const { mock, pages } = session;
  // Gemini's thought signature on a call, DeepSeek-style reasoning_content
  // with tool calls: the next requests must carry both back on that call.
  const signature = { google: { thought_signature: 'c2lnbmF0dXJlLTE=' } };
  await scriptModel(mock, [
    { thinking: 'I should read the form first.', toolCalls: [{ name: 'page_snapshot', arguments: {}, extraContent: signature }] },
    call('navigate', { url: pages.url('archive.html') }, 'Opening the archive.'),
    { text: 'Done.' },
  ]);
  await runTurn(session, 'Look at the form, then open the archive', { approvals: ['navigate'] });
  const requests = mock.requests();
  assert.equal(requests.length, 3);
  for (const request of requests.slice(1)) {
    const assistant = request.body.messages.find((m) => m.role === 'assistant' && m.tool_calls?.[0]?.function?.name === 'page_snapshot');
    assert.ok(assistant, 'the snapshot call is in the history');
    assert.deepEqual(assistant.tool_calls[0].extra_content, signature, 'the thought signature went back on its call');
    assert.equal(assistant.reasoning_content, 'I should read the form first.', 'the reasoning went back with the calls');
  }
  // The second call's message had no signature and no reasoning.
  const navigate = requests[2].body.messages.find((m) => m.role === 'assistant' && m.tool_calls?.[0]?.function?.name === 'navigate');
  assert.equal(navigate.tool_calls[0].extra_content, undefined);
  // The turn's message keeps the note it was first sent with, although the
  // tab moved to the archive between the steps: the steps share a prefix.
  const lastUser = (request) => messageText([...request.body.messages].reverse().find((m) => m.role === 'user'));
  const notes = requests.map(lastUser);
  assert.match(notes[0], /\[Context at send time: [^\]]*current tab: http:\/\/127\.0\.0\.1:\d+\/form\.html /);
  assert.deepEqual(notes, [notes[0], notes[0], notes[0]], 'the same note on every step');
  assertNoOrphans(session);
});

isolatedTest('never_retry_at_most_once_a_write_acts_only_on_the_document_it_was_approved_on', {}, async (session) => {
  const { panel, shop, mock } = session;
  await scriptModel(mock, [
    call('click', { text: 'Subscribe' }, 'Subscribing.'),
    call('click', { text: 'Subscribe' }, 'Trying again on the page as it is now.'),
    { text: 'Done.' },
  ]);
  await submitTask(panel, 'Subscribe me to the newsletter');
  // While the user is asked, the page is reloaded: same site, same URL,
  // another document.
  await waitForApprovalCard(panel);
  await shop.reload();
  await answerApprovalInPanel(panel, 'acceptOnce');
  // The second call was resolved on the reloaded page: it goes through.
  await answerApprovalInPanel(panel, 'acceptOnce');
  const final = await waitForSettledTurn(panel);
  assert.equal(final.state, 'completed', describeState(final));
  const [first, second] = toolExchanges(mock.requests().at(-1));
  assert.match(
    unwrap(first.content),
    /^(Error: )?The page was reloaded or replaced by another page of the same site after the user approved this action; nothing was done\. Call page_snapshot/,
    first.content,
  );
  assert.match(unwrap(second.content), /Clicked button "Subscribe"/, second.content);
  assert.equal(await subscribeClicks(shop), 1, 'one click, on the page the second approval was for');
  assert.deepEqual(toolCards(final).map((c) => [c.toolName, c.status]), [['click', 'error'], ['click', 'ok']], describeState(final));
  assertNoOrphans(session);
});

isolatedTest('never_retry_at_most_once_a_write_acts_only_on_the_element_it_was_approved_on', {}, async (session) => {
  const { panel, shop, mock, pages } = session;
  await scriptModel(mock, [call('page_snapshot', {}, 'Looking.'), { text: 'I see the newsletter form.' }]);
  const first = await runTurn(session, 'Look at the shop');
  const [outline] = toolExchanges(mock.requests().at(-1)).map((e) => pageContent(e.content, pages.origin));
  const ref = refOf(outline, /button "Subscribe"/);

  // The card names the element as the page has it when the user is asked;
  // the page relabels it while the card is shown: nothing is clicked.
  await scriptModel(mock, [call('click', { ref }, 'Subscribing.'), { text: 'It changed; I stopped.' }]);
  await submitTask(panel, 'Subscribe me to the newsletter');
  const card = await waitForApprovalCard(panel);
  assert.equal(card.element, 'button "Subscribe"');
  await shop.evaluate(() => { document.getElementById('subscribe').textContent = 'Delete account'; });
  await answerApprovalInPanel(panel, 'acceptOnce');
  const second = await waitForSettledTurn(panel, { previousTurnId: first.final.turnId });
  assert.equal(second.state, 'completed', describeState(second));
  const [refused] = toolExchanges(mock.requests().at(-1)).slice(-1);
  assert.match(
    unwrap(refused.content),
    new RegExp(`^(Error: )?The element the user approved this action on, button "Subscribe" \\(${ref}\\), changed after the approval \\(it is now button "Delete account" \\(${ref}\\)\\); nothing was done\\.`),
    refused.content,
  );
  assert.equal(await subscribeClicks(shop), 0, 'nothing was clicked');

  // Relabelled before the question: the card tells what the page has now,
  // not what the model read.
  await scriptModel(mock, [call('click', { ref }, 'Subscribing again.'), { text: 'Declined.' }]);
  await submitTask(panel, 'Subscribe me, please');
  const truthful = await answerApprovalInPanel(panel, 'decline');
  assert.equal(truthful.element, 'button "Delete account"');
  const third = await waitForSettledTurn(panel, { previousTurnId: second.turnId });

  // An element the page cannot name is not asked about (the user would
  // approve nothing in particular): the call ends with the page's words.
  await scriptModel(mock, [call('click', { ref: 'e999' }, 'Clicking.'), { text: 'No such element.' }]);
  await submitTask(panel, 'Click e999');
  const fourth = await waitForSettledTurn(panel, { previousTurnId: third.turnId });
  assert.equal(fourth.state, 'completed', describeState(fourth));
  const [unknown] = toolExchanges(mock.requests().at(-1)).slice(-1);
  assert.match(unwrap(unknown.content), /^(Error: )?Unknown ref e999; call page_snapshot/, unknown.content);
  assert.deepEqual(toolCards(fourth).map((c) => [c.toolName, c.status]).at(-1), ['click', 'error'], describeState(fourth));
  assert.equal(await subscribeClicks(shop), 0);
  assertNoOrphans(session);
});

isolatedTest('page_reads_reuse_the_content_script_and_inject_it_again_into_a_new_document', { page: FORM_PAGE }, async (session) => {
  const { panel, shop: form, mock, pages, context, extensionId } = session;
  const worker = await waitForExtensionServiceWorker(context, { extensionId });
  const injections = () => worker.evaluate(() => globalThis.__swAgent.engine.metrics().injections);
  const before = await injections();

  // Two reads of the same document: the script is injected for the first only.
  await scriptModel(mock, [call('page_snapshot', {}, 'Looking.'), call('page_snapshot', {}, 'Again.'), { text: 'Seen twice.' }]);
  const first = await runTurn(session, 'Look at the page twice');
  assert.deepEqual(toolCards(first.final).map((c) => [c.toolName, c.status]), [['page_snapshot', 'ok'], ['page_snapshot', 'ok']], describeState(first.final));
  assert.equal(await injections(), before + 1, 'the second read used the content script already in the page');
  const [one, two] = toolExchanges(mock.requests().at(-1)).map((e) => pageContent(e.content, pages.origin));
  assert.match(one, /^ {2}form "Contact form"$/m);
  assert.equal(two, one, 'the same document, the same outline and refs');

  // A new document has no content script: the read finds nobody, injects, and succeeds.
  await form.reload();
  await scriptModel(mock, [call('page_snapshot', {}, 'Looking at the reloaded page.'), { text: 'Seen.' }]);
  const second = await runTurn(session, 'Look at it again', { previousTurnId: first.final.turnId });
  assert.deepEqual(toolCards(second.final).map((c) => [c.toolName, c.status]).at(-1), ['page_snapshot', 'ok'], describeState(second.final));
  assert.equal(await injections(), before + 2, 'injected into the new document');
  const [reloaded] = toolExchanges(mock.requests().at(-1)).slice(-1).map((e) => pageContent(e.content, pages.origin));
  assert.match(reloaded, /^ {2}form "Contact form"$/m);

  // A write is never sent on the chance that a script is there: it injects first.
  const nameRef = refOf(reloaded, /textbox "Full name"/);
  await scriptModel(mock, [call('type', { ref: nameRef, text: 'Ada' }, 'Typing.'), { text: 'Typed.' }]);
  await runTurn(session, 'Type Ada', { approvals: ['type'], previousTurnId: second.final.turnId });
  assert.equal(await form.inputValue('#name'), 'Ada');
  assert.equal(await injections(), before + 3, 'the write injected (idempotent on the page side)');
  assertNoOrphans(session);
});

// An extension update stops the worker mid-turn and orphans the content
// script it injected (its runtime is gone, its page stays). The new version
// resumes the run from IndexedDB, and its first read of the same tab finds
// no listener (the orphan cannot answer; the new script would run in a fresh
// isolated world anyway), injects and reads.
isolatedTest(
  'page_tools_work_after_an_extension_update_mid_turn',
  { page: FORM_PAGE, launch: { extraArgs: ['--enable-unsafe-extension-debugging'] } },
  async (session) => {
    const { panel, shop: form, mock, pages, context, extensionId } = session;
    await scriptModel(mock, [
      call('page_snapshot', {}, 'Looking.'),
      { stallMs: 600000, text: 'Let me think', tickMs: 250, tickText: '.' },
      // The resumed request waits while the test puts the page back in
      // front (the old version's panel tab closed; the tab the page tool
      // acts on is the active one).
      { stallMs: 12000, stallAt: 'headers', then: call('page_snapshot', {}, 'Looking again.') },
      { text: 'Seen it before and after the update.' },
    ]);
    await submitTask(panel, 'Look at the page');
    await mock.waitForRequests(2, { timeout: 60000 });
    await waitFor(() => mock.requests()[1].outcome === 'stalled', { timeout: 30000, message: 'the second request to stall' });
    const oldWorker = await waitForExtensionServiceWorker(context, { extensionId });
    assert.equal(await oldWorker.evaluate(() => globalThis.__swAgent.engine.metrics().injections), 1);

    const worker = await updateExtension(context, extensionId);
    await waitFor(() => mock.requests()[1].outcome === 'aborted', { timeout: 30000, message: 'the old worker to drop its request' });
    await mock.waitForRequests(3, { timeout: 60000 });
    // The panel of the old version closed with it; open the new version's.
    session.panel = await openPanel(context, extensionId);
    await form.bringToFront();
    const final = await waitForSettledTurn(session.panel);
    assert.equal(final.state, 'completed', describeState(final));
    assert.deepEqual(toolCards(final).map((c) => [c.toolName, c.status]), [['page_snapshot', 'ok'], ['page_snapshot', 'ok']], describeState(final));
    assert.match(topLevelNodes(final).at(-1).text, /Seen it before and after the update\./);
    assert.equal(topLevelNodes(final).filter((n) => n.kind === 'user_message').length, 1, 'the user message is kept once');
    assert.equal(await worker.evaluate(() => globalThis.__swAgent.engine.metrics().injections), 1, 'the new version injected its own script once');

    const requests = mock.requests();
    assert.equal(requests.length, 4, 'two reads, the stalled request, its resumed request and the answer');
    const reads = toolExchanges(requests[3]).map((e) => pageContent(e.content, pages.origin));
    assert.equal(reads.length, 2);
    assert.match(reads[1], /^ {2}form "Contact form"$/m, 'the read after the update saw the page');
    assertNoOrphans(session);
  },
);

isolatedTest('wait_for_interrupted_by_navigation_is_a_clear_tool_error', { page: FORM_PAGE }, async (session) => {
  const { panel, shop: form, mock, pages } = session;
  await scriptModel(mock, [
    call('wait_for', { text: 'This never appears', timeout_ms: 25000 }, 'Waiting for the confirmation.'),
    { text: 'The page changed while I was waiting.' },
  ]);
  await submitTask(panel, 'Wait for the confirmation');
  // The content script reports progress every second; navigate once it is waiting.
  const progress = await waitForToolProgress(panel, { message: 'a tool progress event of wait_for' });
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

isolatedTest('never_retry_at_most_once_a_click_blocked_in_a_page_dialog_past_the_time_limit_is_reported_as_unknown', { page: 'confirm.html' }, async (session) => {
  // The click opens confirm(), which blocks the page until the user answers:
  // past the tool's time limit (60 s) the action may still happen. The model
  // must be told its outcome is unknown, not that it failed (which invites
  // clicking again).
  const { panel, shop: page, mock, pages } = session;
  const answered = new Promise((resolve) => {
    page.once('dialog', (dialog) => {
      setTimeout(() => dialog.accept().then(resolve, resolve), 63000);
    });
  });
  await scriptModel(mock, [
    call('click', { text: 'Delete draft' }, 'Deleting the draft.'),
    { text: 'I could not tell whether the draft was deleted; please check.' },
  ]);
  const { final } = await runTurn(session, 'Delete the draft', { approvals: ['click'] });
  const exchange = toolExchanges(mock.requests()[1]).find((e) => e.name === 'click');
  assert.match(
    unwrap(exchange.content),
    /The page did not answer within 60 seconds after the action was sent\..*whether the action happened is unknown\. Look at the page \(page_snapshot\) before doing it again/s,
    exchange.content,
  );
  assert.equal(mock.requests().length, 2, 'the click, then the answer: nothing was clicked again');
  await answered;
  await waitFor(async () => (await page.evaluate(() => document.body.dataset.deleted)) === '1', {
    message: 'the user accepted the dialog: the draft was deleted once',
  });
  assert.equal(page.url(), pages.url('confirm.html'));
  const card = toolCards(final).find((c) => c.toolName === 'click');
  assert.equal(card.status, 'error', describeState(final));
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

/** The ref of the first snapshot line matching `pattern`, frame refs (f3:e12) included. */
function anyRefOf(snapshot, pattern) {
  const line = snapshot.split('\n').find((l) => /\[(f\d+:)?e\d+\]/.test(l) && pattern.test(l));
  assert.ok(line, `no snapshot line matches ${pattern}:\n${snapshot}`);
  return /\[((?:f\d+:)?e\d+)\]/.exec(line)[1];
}

/** Saves the panel with the tool card of `callId` in view as target/e2e/screens/<name>.png (for review). */
async function screenshotCard(panel, callId, name) {
  const dir = path.join(REPO_ROOT, 'target', 'e2e', 'screens');
  mkdirSync(dir, { recursive: true });
  await panel.locator(`#messages .node.tool-call[data-call-id="${callId}"]`).scrollIntoViewIfNeeded();
  await panel.screenshot({ path: path.join(dir, `${name}.png`) });
}

/** The page's payment iframe (another origin) once it has loaded. */
async function paymentFrame(page) {
  return waitFor(
    async () => {
      const frame = page.frames().find((f) => f.url().endsWith('/payment.html'));
      return frame && (await frame.evaluate(() => document.readyState === 'complete').catch(() => false)) ? frame : null;
    },
    { timeout: 30000, message: 'the payment iframe to load' },
  );
}

isolatedTest('frame_targeting_snapshot_click_and_diff_inside_a_cross_origin_iframe', { page: 'checkout.html' }, async (session) => {
  const { panel, shop: page, mock, pages } = session;
  const frameOrigin = pages.origin.replace('127.0.0.1', 'localhost');
  const frame = await paymentFrame(page);
  assert.equal(new URL(frame.url()).origin, frameOrigin, 'the payment form comes from another origin');

  // ---- Turn 1: the snapshot includes the frame's outline, with frame refs.
  await scriptModel(mock, [call('page_snapshot', {}, 'Let me look at the checkout.'), { text: 'I see the payment form.' }]);
  const first = await runTurn(session, 'Look at the checkout');
  const snapshot = pageContent(toolExchanges(mock.requests()[1]).find((e) => e.name === 'page_snapshot').content, pages.origin);
  assert.match(snapshot, /^Title: Acme checkout\n/);
  const frameLine = new RegExp(`^iframe "Payment" \\[frame f(\\d+)\\] ${frameOrigin.replace(/[.]/g, '\\.')}/payment\\.html$`, 'm');
  assert.match(snapshot, frameLine, snapshot);
  const frameId = frameLine.exec(snapshot)[1];
  assert.match(snapshot, new RegExp(`^ {2}h2 "Card payment"$`, 'm'), 'the frame outline is indented under its iframe line');
  assert.match(snapshot, new RegExp(`^ {2}\\[f${frameId}:e\\d+\\] textbox "Card number"$`, 'm'));
  const payRef = anyRefOf(snapshot, /button "Pay now"/);
  const orderRef = anyRefOf(snapshot, /button "Place order"/);
  assert.match(payRef, new RegExp(`^f${frameId}:e\\d+$`));
  assert.match(orderRef, /^e\d+$/, 'the page\'s own refs stay plain');
  assert.doesNotMatch(snapshot, /other site: its content is not shown/);
  const firstCard = toolCards(first.final).find((c) => c.toolName === 'page_snapshot');
  assert.equal(firstCard.diff, null, 'the first snapshot of a page has nothing to compare with');

  // ---- Turn 2: click the frame's button (asks for the frame's origin), then look again.
  await scriptModel(mock, [
    call('click', { ref: payRef }, 'Paying.'),
    call('page_snapshot'),
    { text: 'Paid.' },
  ]);
  await submitTask(panel, 'Pay for the order');
  await waitForApprovalCard(panel);
  const screens = path.join(REPO_ROOT, 'target', 'e2e', 'screens');
  mkdirSync(screens, { recursive: true });
  await panel.screenshot({ path: path.join(screens, 'approval-in-frame.png') });
  const card = await answerApprovalInPanel(panel, 'acceptOnce');
  assert.equal(card.toolName, 'click');
  assert.deepEqual(card.params, { ref: payRef });
  assert.equal(card.origin, frameOrigin, 'the approval names the origin acted on: the frame\'s');
  assert.equal(card.url, `${frameOrigin}/payment.html`);
  assert.equal(card.frame, `a frame of the page ${pages.url('checkout.html')}`);
  assert.match(card.element, /^button "Pay now"/, 'the panel found the frame ref in the snapshot');
  const second = await waitForSettledTurn(panel, { previousTurnId: first.final.turnId });
  assert.equal(second.state, 'completed', describeState(second));

  // The click happened in the frame, once; the page's own button was not touched.
  assert.equal(await frame.evaluate(() => document.body.dataset.payClicks), '1');
  assert.equal(await page.evaluate(() => document.body.dataset.orderClicks), '0');
  const exchanges = toolExchanges(mock.requests().at(-1));
  const clickResult = exchanges.find((e) => e.name === 'click');
  assert.equal(pageContent(clickResult.content, frameOrigin), `Clicked button "Pay now" (${payRef}).`);
  const history = await approvalHistory(panel);
  assert.equal(history.length, 1);
  assert.equal(history[0].frameId, Number(frameId));
  assert.equal(history[0].pageUrl, pages.url('checkout.html'));

  // The second snapshot: the model gets all of it, the card shows what changed.
  const again = pageContent(exchanges.filter((e) => e.name === 'page_snapshot').at(-1).content, pages.origin);
  assert.match(again, /^Title: Acme checkout\n/);
  assert.match(again, /^ +text "Payment accepted\."$/m);
  assert.match(again, /\[e\d+\] button "Place order"/, 'the full snapshot, not a diff');
  const cards = toolCards(second);
  assert.deepEqual(cards.slice(-2).map((c) => [c.toolName, c.status]), [['click', 'ok'], ['page_snapshot', 'ok']], describeState(second));
  const diff = cards.at(-1).diff;
  assert.ok(diff, `the second snapshot's card shows a diff\n${describeState(second)}`);
  assert.match(diff.summary, /^Changed since the previous snapshot: \d+ added, \d+ removed$/);
  assert.ok(diff.added.includes('+ text "Payment accepted."'), JSON.stringify(diff));
  assert.ok(diff.open, 'the changes are shown without a click');
  await screenshotCard(panel, cards.at(-1).callId, 'snapshot-diff');
  const node = (await portNodes(panel)).find((n) => n.kind === 'tool_result' && n.name === 'page_snapshot' && n.details?.diff);
  assert.ok(node.details.diff.added >= 1 && node.details.diff.changes.length <= 40, JSON.stringify(node.details.diff));
  assert.deepEqual(node.details.frames.map((f) => [f.frameId, f.origin]), [[Number(frameId), frameOrigin]]);

  // ---- Turn 3: the iframe is removed; its refs are stale: a clear error, nothing asked.
  await page.evaluate(() => document.getElementById('payment').remove());
  await scriptModel(mock, [call('click', { ref: payRef }, 'Paying again.'), { text: 'The payment form is gone.' }]);
  const third = await runTurn(session, 'Pay again', { previousTurnId: second.turnId });
  const stale = toolExchanges(mock.requests().at(-1)).filter((e) => e.name === 'click').at(-1);
  assert.match(stale.content, new RegExp(`^(Error: )?The frame f${frameId} is no longer on the page .*Call page_snapshot to get fresh refs\\.$`), stale.content);
  assert.equal((await approvalHistory(panel)).length, 1, 'no question about a frame that is gone');
  assert.equal(toolCards(third.final).at(-1).status, 'error');
  assertNoOrphans(session);
});

/** Every node the panel received (initialized snapshots and item.complete events), last version per id. */
async function portNodes(panel) {
  const byId = new Map();
  for (const entry of (await portLog(panel)) ?? []) {
    if (entry.dir !== 'in' || !entry.json) continue;
    const message = JSON.parse(entry.json);
    const nodes = message.type === 'item.complete' ? [message.node] : message.type === 'initialized' ? message.snapshot?.thread?.nodes ?? [] : [];
    for (const node of nodes) if (node?.id) byId.set(node.id, node);
  }
  return [...byId.values()];
}

/** [width, height] from a JPEG's start-of-frame marker. */
function jpegSize(bytes) {
  for (let i = 2; i + 9 < bytes.length; ) {
    if (bytes[i] !== 0xff) return null;
    const marker = bytes[i + 1];
    const length = bytes.readUInt16BE(i + 2);
    if (marker >= 0xc0 && marker <= 0xc3) return [bytes.readUInt16BE(i + 7), bytes.readUInt16BE(i + 5)];
    i += 2 + length;
  }
  return null;
}

isolatedTest('screenshot_reaches_a_vision_model_as_an_image_with_a_thumbnail_in_the_card', { page: 'shop.html' }, async (session) => {
  const { panel, mock, pages, shop } = session;
  // Without vision the tool is not offered.
  await scriptModel(mock, [{ text: 'Hello.' }]);
  const plain = await runTurn(session, 'Say hello');
  const offered = (mock.requests()[0].body.tools ?? []).map((t) => t.function?.name);
  assert.ok(offered.includes('page_snapshot') && !offered.includes('screenshot'), `tools without vision: ${offered}`);

  await enableVision(panel);
  await shop.bringToFront();
  await scriptModel(mock, [call('screenshot', {}, 'Let me see the page.'), { text: 'It shows the newsletter.' }]);
  const requestsBefore = mock.requests().length;
  const shot = await runTurn(session, 'What does the page look like?', { previousTurnId: plain.final.turnId });
  const requests = mock.requests().slice(requestsBefore);
  assert.equal(requests.length, 2);
  assert.ok(requests[0].body.tools.some((t) => t.function?.name === 'screenshot'), 'offered to a vision model');

  // The provider got the image (OpenAI: a user message after the tool results).
  const messages = requests[1].body.messages;
  const result = messages.find((m) => m.role === 'tool');
  const text = messageText(result);
  const [screenshotLine] = pageContent(text.slice(0, text.lastIndexOf('\n[The image is attached in the next message.]')).replace(/\n[^\n]*$/, ''), pages.origin).split('\n');
  const size = new RegExp(`^Screenshot of "Acme Newsletter" ${pages.url('shop.html').replace(/[.]/g, '\\.')} \\((\\d+)×(\\d+) JPEG, \\d+ KB\\)\\.$`).exec(screenshotLine);
  assert.ok(size, screenshotLine);
  assert.ok(text.endsWith('\n[The image is attached in the next message.]'), text);
  const [width, height] = [Number(size[1]), Number(size[2])];
  assert.ok(width > 100 && height > 100 && Math.max(width, height) <= 1280, `${width}×${height}`);
  const imagePart = messages.filter((m) => m.role === 'user' && Array.isArray(m.content)).flatMap((m) => m.content).find((p) => p.type === 'image_url');
  assert.ok(imagePart, 'an image part reached the provider');
  const match = /^data:image\/jpeg;base64,([A-Za-z0-9+/]+=*)$/.exec(imagePart.image_url.url);
  assert.ok(match, imagePart.image_url.url.slice(0, 60));
  const jpeg = Buffer.from(match[1], 'base64');
  assert.deepEqual([...jpeg.subarray(0, 3)], [0xff, 0xd8, 0xff], 'a JPEG');
  assert.deepEqual(jpegSize(jpeg), [width, height], 'the image has the size the result names');
  assert.ok(match[1].length <= 400 * 1024, `within the documented bound: ${match[1].length}`);
  mkdirSync(path.join(REPO_ROOT, 'target', 'e2e'), { recursive: true });
  writeFileSync(path.join(REPO_ROOT, 'target', 'e2e', 'screenshot-tool.jpg'), jpeg);

  // The card shows the thumbnail (a small JPEG data URL from details).
  const card = toolCards(shot.final).find((c) => c.toolName === 'screenshot');
  assert.equal(card.status, 'ok', describeState(shot.final));
  assert.ok(card.thumbnail, 'the card has a thumbnail');
  assert.match(card.thumbnail.src, /^data:image\/jpeg;base64,/);
  assert.ok(card.thumbnail.src.length <= 24 * 1024, `thumbnail size ${card.thumbnail.src.length}`);
  const longest = Math.max(width, height);
  assert.deepEqual(
    [card.thumbnail.naturalWidth, card.thumbnail.naturalHeight],
    [Math.round((width * 240) / longest), Math.round((height * 240) / longest)],
    'at most 240 px on the longer side, same aspect',
  );
  assert.ok(card.thumbnail.visible, 'the thumbnail is rendered');
  await screenshotCard(panel, card.callId, 'screenshot-thumbnail');

  // The durable node stays within the bound: one bounded image plus the thumbnail.
  const dump = await dumpIndexedDb(panel);
  const nodes = Object.values(dump).flatMap((stores) => stores.nodes ?? []);
  const stored = nodes.map((n) => JSON.stringify(n.value)).filter((json) => json.includes('Screenshot of'));
  assert.equal(stored.length, 1);
  assert.ok(stored[0].length <= 400 * 1024 + 24 * 1024 + 4096, `node size ${stored[0].length}`);
  assertNoOrphans(session);
});

// Web components with closed shadow roots (design systems, checkout
// widgets): `host.shadowRoot` is null for them, so the page's DOM APIs
// cannot reach in; the content script does through Chrome's
// chrome.dom.openOrClosedShadowRoot. tests/pages/closed-shadow.html: a
// labelled field and a submit button in a closed root, and a nested closed
// root with a field named by aria-labelledby and a button.
isolatedTest('controls_inside_closed_shadow_roots_can_be_read_and_used', { page: 'closed-shadow.html' }, async (session) => {
  const { shop: widget, mock, pages } = session;
  assert.equal(await widget.evaluate(() => document.getElementById('checkout').shadowRoot), null, 'the page keeps its root closed');

  // ---- Turn 1: the model reads the page, the closed roots included.
  await scriptModel(mock, [call('read_page', {}, 'Reading the page.'), { text: 'I see a payment form.' }]);
  const first = await runTurn(session, 'Read the payment widget');
  assert.deepEqual(toolCards(first.final).map((c) => [c.toolName, c.status]), [['read_page', 'ok']], describeState(first.final));
  const read = pageContent(toolExchanges(mock.requests().at(-1)).find((e) => e.name === 'read_page').content, pages.origin);
  assert.match(read, /^Title: Acme pay widget\n/);
  assert.match(read, /^Payment$/m, 'the closed root\'s text');
  const name = refOf(read, /^\[e\d+\] textbox "Name on card"$/);
  const pay = refOf(read, /^\[e\d+\] button "Pay now"$/);
  const coupon = refOf(read, /^\[e\d+\] textbox "Coupon code"$/);
  const apply = refOf(read, /^\[e\d+\] button "Apply coupon"$/);

  // ---- Turn 2: type into both fields and click both buttons (each asks first).
  await scriptModel(mock, [
    call('type', { ref: name, text: 'Ada Lovelace' }, 'Typing the name on the card.'),
    call('type', { ref: coupon, text: 'SPRING' }),
    call('click', { ref: apply }),
    call('click', { ref: pay }),
    { text: 'Paid with the coupon.' },
  ]);
  const second = await runTurn(session, 'Pay as Ada Lovelace with the coupon SPRING', {
    approvals: ['type', 'type', 'click', 'click'],
    previousTurnId: first.final.turnId,
  });
  // The approval cards name the elements inside the closed roots.
  assert.deepEqual(
    second.cards.map((card) => [card.params.ref, card.element.replace(/^(\w+ "[^"]*").*$/, '$1')]),
    [[name, 'textbox "Name on card"'], [coupon, 'textbox "Coupon code"'], [apply, 'button "Apply coupon"'], [pay, 'button "Pay now"']],
  );

  // The page: the component's field got the text (input and change), its form was submitted, the coupon applied.
  assert.equal(await widget.evaluate(() => document.body.dataset.coupon), 'SPRING');
  assert.equal(await widget.evaluate(() => document.body.dataset.paidBy), 'Ada Lovelace');
  assert.deepEqual(
    await widget.evaluate(() => window.payEvents.filter((e) => e.type !== 'coupon-input')),
    [{ type: 'input', value: 'Ada Lovelace' }, { type: 'change', value: 'Ada Lovelace' }, { type: 'submit', value: 'Ada Lovelace' }],
  );

  // What the model received.
  const results = toolExchanges(mock.requests().at(-1)).slice(-4).map((e) => pageContent(e.content, pages.origin));
  assert.deepEqual(results, [
    `Typed "Ada Lovelace" into textbox "Name on card" (${name}).`,
    `Typed "SPRING" into textbox "Coupon code" (${coupon}).`,
    `Clicked button "Apply coupon" (${apply}).`,
    `Clicked button "Pay now" (${pay}).`,
  ]);
  assert.deepEqual(
    toolCards(second.final).slice(-4).map((c) => [c.toolName, c.status]),
    [['type', 'ok'], ['type', 'ok'], ['click', 'ok'], ['click', 'ok']],
    describeState(second.final),
  );
  assertNoOrphans(session);
});
