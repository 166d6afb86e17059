// Tests of the mock MCP server's resumability (`resumable`): numbered
// answer-stream events, a stream cut on purpose (cutNextCallStream), GET
// streams ended or broken on purpose (closeStreams, breakStreams) or polled
// (getStreamPolling) and kept meanwhile, resumptions refused on purpose
// (failNextResumptions), and a GET with Last-Event-ID that gets the rest
// of either, as MCP's Streamable HTTP transport (2025-06-18,
// "Resumability and Redelivery") describes. What the engine's MCP client resumes against
// must itself behave like it.
//
// Run:  node --test tests/mock-mcp/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { demoTools, startMockMcp } from './server.mjs';
import { eventReader, post, resume, session } from './client.mjs';

const ELICITING = { elicitation: {} };

/** A tools/call with a progress token (`p<id>`). */
const call = (id, name, args = {}) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args, _meta: { progressToken: `p${id}` } } });

/**
 * A tool `staged` that reports `before` progress steps, waits until
 * `release()`, then reports `after` more, sends a log notification
 * (ctx.notify) and answers: the test decides what happens after a cut.
 */
function stagedTool() {
  let release;
  const released = new Promise((resolve) => {
    release = resolve;
  });
  const tool = {
    name: 'staged',
    description: 'Reports progress in two stages.',
    inputSchema: { type: 'object', properties: { before: { type: 'integer' }, after: { type: 'integer' } } },
    run: async ({ before = 2, after = 2 }, ctx) => {
      const total = before + after;
      for (let i = 1; i <= before; i += 1) ctx.progress(i, total);
      await new Promise((resolve, rejectWait) => {
        released.then(resolve);
        ctx.signal.addEventListener('abort', () => rejectWait(ctx.signal.reason), { once: true });
      });
      for (let i = before + 1; i <= total; i += 1) ctx.progress(i, total);
      ctx.notify('notifications/message', { level: 'info', data: 'staged: done' });
      return { content: [{ type: 'text', text: `Staged ${total} steps.` }] };
    },
  };
  return { tool, release: () => release() };
}

/** Reads events until the stream ends (null) or breaks (the error); → { events, broke }. */
async function readToEnd(reader) {
  const events = [];
  try {
    for (let event = await reader.nextEvent(); event; event = await reader.nextEvent()) events.push(event);
    return { events, broke: null };
  } catch (error) {
    return { events, broke: error };
  }
}

/** The JSON-RPC error body of a refused request. */
async function refusal(response) {
  assert.match(response.headers.get('content-type') ?? '', /^application\/json/);
  return (await response.json()).error;
}

test('resumable_numbers_every_answer_event_and_the_first_carries_retry', async (t) => {
  const staged = stagedTool();
  staged.release();
  const mock = await startMockMcp({ tools: [staged.tool], resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);

  const { events, broke } = await readToEnd(eventReader(await post(mock, call(7, 'staged'), { session: s.id })));
  assert.equal(broke, null, 'ends cleanly');
  assert.deepEqual(events.map((e) => e.id), ['post-1:1', 'post-1:2', 'post-1:3', 'post-1:4', 'post-1:5', 'post-1:6']);
  assert.deepEqual(events.map((e) => e.retry), [200, null, null, null, null, null], 'retry (resumeRetryMs, default 200) on the first only');
  assert.deepEqual(events.map((e) => e.message.method ?? 'response'), [
    'notifications/progress', 'notifications/progress', 'notifications/progress', 'notifications/progress', 'notifications/message', 'response',
  ]);
  assert.equal(events[5].message.id, 7);
  const [sent] = mock.sent();
  assert.equal(sent.eventId, 'post-1:5', 'ctx.notify\'s entry says which event');
  assert.equal(sent.kept, undefined, 'written on the POST');

  // Each answer stream is numbered on its own.
  const second = eventReader(await post(mock, call(8, 'staged'), { session: s.id }));
  assert.equal((await second.nextEvent()).id, 'post-2:1');
  await readToEnd(second);

  // Delivered: nothing kept, resuming it is refused.
  assert.deepEqual(mock.keptStreams(), []);
  assert.equal((await resume(mock, 'post-1:5', { session: s.id })).status, 400);

  // The session's GET stream numbers its events too (kept as well: see the
  // GET stream tests below).
  const notifications = eventReader(await resume(mock, undefined, { session: s.id }));
  assert.equal(await notifications.saw(': open\n\n'), true);
  assert.equal(mock.notifyListChanged(), 1);
  const changed = await notifications.nextEvent();
  assert.equal(changed.message.method, 'notifications/tools/list_changed');
  assert.equal(changed.id, 'get-1:1');
  assert.equal(changed.retry, null);
  assert.equal(mock.sent().at(-1).eventId, 'get-1:1');
  const refused = await resume(mock, 'get-1:2', { session: s.id });
  assert.equal(refused.status, 400);
  assert.match((await refusal(refused)).message, /^Unknown Last-Event-ID: get-1:2 \(the stream has 1 events\)/);
  notifications.cancel();

  // resumeRetryMs: another delay, or (null) no retry field at all.
  for (const [retryMs, expected] of [[1500, 1500], [null, null]]) {
    const other = await startMockMcp({ resumable: true, resumeRetryMs: retryMs });
    t.after(() => other.close());
    const o = await session(other);
    const first = await eventReader(await post(other, call(9, 'slow_report', { steps: 1 }), { session: o.id })).nextEvent();
    assert.equal(first.id, 'post-1:1');
    assert.equal(first.retry, expected);
  }
  await assert.rejects(startMockMcp({ resumable: true, resumeRetryMs: -1 }), /resumeRetryMs/);
});

test('without_resumable_events_carry_no_id_and_last_event_id_is_a_plain_get', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);

  const reader = eventReader(await post(mock, call(3, 'slow_report', { steps: 1 }), { session: s.id }));
  const { events } = await readToEnd(reader);
  assert.equal(events.length, 2);
  assert.deepEqual(events.map((e) => [e.id, e.retry]), [[null, null], [null, null]]);
  assert.doesNotMatch(reader.raw(), /^(id|retry):/m);

  // Last-Event-ID means nothing here: a GET stream opens as for any GET.
  const response = await resume(mock, 'post-1:1', { session: s.id });
  assert.equal(response.status, 200);
  const stream = eventReader(response);
  assert.equal(await stream.saw(': open\n\n'), true);
  assert.equal(mock.notifyListChanged(), 1);
  const changed = await stream.nextEvent();
  assert.equal(changed.message.method, 'notifications/tools/list_changed');
  assert.equal(changed.id, null);
  assert.equal(mock.streams().length, 1);
  assert.equal(mock.streams()[0].lastEventId, undefined);
  assert.deepEqual(mock.resumes(), []);
  stream.cancel();

  // A cut still cuts; the call runs to its end, its later events lost.
  mock.cutNextCallStream({ afterEvents: 1 });
  const cut = await readToEnd(eventReader(await post(mock, call(4, 'slow_report', { steps: 2 }), { session: s.id })));
  assert.equal(cut.events.length, 1);
  assert.ok(cut.broke, 'the body broke off');
  await mock.waitFor((log) => log.some((e) => e.id === 4 && e.outcome === 'answered'), { timeout: 5000 });
  assert.deepEqual(mock.cuts().map((e) => [e.stream, e.id, e.afterEvents, e.written, e.how]), [['post-2', 4, 1, 1, 'destroy']]);
  assert.deepEqual(mock.keptStreams(), []);
});

test('a_destroyed_stream_resumed_from_its_last_event_gets_the_rest_as_it_happens', async (t) => {
  const staged = stagedTool();
  const mock = await startMockMcp({ tools: [staged.tool], resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);

  mock.cutNextCallStream({ afterEvents: 2 });
  const cut = eventReader(await post(mock, call(5, 'staged'), { session: s.id }));
  const { events: before, broke } = await readToEnd(cut);
  assert.deepEqual(before.map((e) => [e.id, e.message.params.progress]), [['post-1:1', 1], ['post-1:2', 2]]);
  assert.ok(broke, 'a network error, not a clean end');
  assert.equal(cut.lastEventId(), 'post-1:2');

  const [entry] = mock.cuts();
  assert.equal(entry.kind, 'cut');
  assert.equal(entry.stream, 'post-1');
  assert.equal(entry.method, 'tools/call');
  assert.equal(entry.id, 5);
  assert.equal(entry.afterEvents, 2);
  assert.equal(entry.written, 2);
  assert.equal(entry.how, 'destroy');
  assert.equal(entry.session, s.id);
  assert.equal(mock.calls()[0].outcome, undefined, 'the call runs on');
  assert.deepEqual(mock.keptStreams(), [{ stream: 'post-1', session: s.id, callId: 5, events: 2, answered: false, detached: true }]);

  // Nothing to replay yet: the rest comes as it happens.
  const response = await resume(mock, cut.lastEventId(), { session: s.id });
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type'), /^text\/event-stream/);
  const resumed = eventReader(response);
  const [entered] = mock.resumes();
  assert.equal(entered.lastEventId, 'post-1:2');
  assert.equal(entered.stream, 'post-1');
  assert.equal(entered.callId, 5);
  assert.equal(entered.replayed, 0);
  assert.equal(entered.status, 200);
  assert.equal(entered.session, s.id);
  assert.equal(entered.headers['last-event-id'], 'post-1:2');
  assert.equal(entered.headers['mcp-protocol-version'], '2025-06-18');
  assert.equal(entered.delivered, false);
  assert.equal(entered.closed, false);

  staged.release();
  const { events: after, broke: brokeAgain } = await readToEnd(resumed);
  assert.equal(brokeAgain, null, 'ends cleanly after the response');
  assert.deepEqual(after.map((e) => e.id), ['post-1:3', 'post-1:4', 'post-1:5', 'post-1:6'], 'the ids go on');
  assert.deepEqual(after.map((e) => e.message.method ?? 'response'), ['notifications/progress', 'notifications/progress', 'notifications/message', 'response']);
  assert.deepEqual(after.slice(0, 2).map((e) => e.message.params), [{ progressToken: 'p5', progress: 3, total: 4 }, { progressToken: 'p5', progress: 4, total: 4 }]);
  assert.equal(after[3].message.id, 5);
  assert.equal(after[3].message.result.content[0].text, 'Staged 4 steps.');

  assert.equal(mock.calls()[0].outcome, 'answered');
  assert.equal(entered.delivered, true);
  assert.equal(entered.closed, true);
  assert.equal(entered.closedBy, 'server');
  assert.deepEqual(mock.sent().map((e) => [e.eventId, e.kept]), [['post-1:5', undefined]], 'written on the resuming GET');
  assert.deepEqual(mock.keptStreams(), [], 'dropped once delivered');
  assert.equal((await resume(mock, 'post-1:6', { session: s.id })).status, 400);
  assert.deepEqual(mock.log().filter((e) => e.kind === 'cut' || e.kind === 'resume').map((e) => [e.kind, e.status ?? null]), [['cut', null], ['resume', 200], ['resume', 400]]);
});

test('a_stream_ended_cleanly_by_close_true_keeps_the_rest_even_when_the_call_finished_first', async (t) => {
  const staged = stagedTool();
  // listChanged false: no GET stream of the server's own, yet resuming works.
  const mock = await startMockMcp({ tools: [staged.tool], resumable: true, listChanged: false });
  t.after(() => mock.close());
  const s = await session(mock);

  mock.cutNextCallStream({ afterEvents: 1, close: true });
  const cut = eventReader(await post(mock, call(6, 'staged'), { session: s.id }));
  const { events, broke } = await readToEnd(cut);
  assert.equal(broke, null, 'the body ends cleanly, without the response');
  assert.deepEqual(events.map((e) => e.id), ['post-1:1']);
  assert.equal(mock.cuts()[0].how, 'close');

  // The call finishes with nobody listening: everything is kept.
  staged.release();
  await mock.waitFor((log) => log.some((e) => e.id === 6 && e.outcome === 'answered'), { timeout: 5000 });
  assert.deepEqual(mock.keptStreams(), [{ stream: 'post-1', session: s.id, callId: 6, events: 6, answered: true, detached: true }]);
  assert.deepEqual(mock.sent().map((e) => [e.eventId, e.kept]), [['post-1:5', true]]);

  const response = await resume(mock, 'post-1:1', { session: s.id });
  assert.equal(response.status, 200);
  const rest = await readToEnd(eventReader(response));
  assert.equal(rest.broke, null);
  assert.deepEqual(rest.events.map((e) => e.id), ['post-1:2', 'post-1:3', 'post-1:4', 'post-1:5', 'post-1:6']);
  assert.equal(rest.events.at(-1).message.result.content[0].text, 'Staged 4 steps.');
  const [entry] = mock.resumes();
  assert.equal(entry.replayed, 5);
  assert.equal(entry.delivered, true);
  assert.deepEqual(mock.keptStreams(), []);
  assert.equal((await resume(mock, undefined, { session: s.id })).status, 405, 'a plain GET is still refused');
});

test('resuming_from_an_earlier_id_replays_more_and_takes_over_an_earlier_resumption', async (t) => {
  const staged = stagedTool();
  const mock = await startMockMcp({ tools: [staged.tool], resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);

  mock.cutNextCallStream({ afterEvents: 3 });
  const { events: original } = await readToEnd(eventReader(await post(mock, call(11, 'staged', { before: 3, after: 1 }), { session: s.id })));
  assert.deepEqual(original.map((e) => e.id), ['post-1:1', 'post-1:2', 'post-1:3']);

  const first = eventReader(await resume(mock, 'post-1:3', { session: s.id }));
  const again = eventReader(await resume(mock, 'post-1:1', { session: s.id }));
  assert.deepEqual(await again.nextEvent(), original[1], 'the same events, ids (and retry) as first sent');
  assert.deepEqual(await again.nextEvent(), original[2]);
  assert.deepEqual(mock.resumes().map((e) => [e.lastEventId, e.replayed]), [['post-1:3', 0], ['post-1:1', 2]]);

  // One message, one stream: the earlier resumption ended, the later one goes on.
  assert.deepEqual(await readToEnd(first), { events: [], broke: null });
  assert.equal(mock.resumes()[0].closedBy, 'server');
  assert.equal(mock.resumes()[0].delivered, false);
  staged.release();
  const { events: rest } = await readToEnd(again);
  assert.deepEqual(rest.map((e) => e.id), ['post-1:4', 'post-1:5', 'post-1:6']);
  assert.equal(rest.at(-1).message.id, 11);
  assert.equal(mock.resumes()[1].delivered, true);
});

test('an_unknown_id_or_another_session_s_stream_is_400_never_404', async (t) => {
  const staged = stagedTool();
  const mock = await startMockMcp({ tools: [staged.tool], resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);
  const other = await session(mock);
  mock.cutNextCallStream({ afterEvents: 2 });
  await readToEnd(eventReader(await post(mock, call(12, 'staged'), { session: s.id })));

  const refused = [
    ['post-1:2', other.id, /no such answer stream kept in this session/],
    ['post-9:1', s.id, /no such answer stream kept in this session/],
    ['post-1:3', s.id, /the stream has 2 events/],
    ['post-1', s.id, /no such answer stream/],
    ['nonsense', s.id, /no such answer stream/],
  ];
  for (const [lastEventId, id, why] of refused) {
    const response = await resume(mock, lastEventId, { session: id });
    assert.equal(response.status, 400, lastEventId);
    const error = await refusal(response);
    assert.equal(error.code, -32600);
    assert.ok(error.message.startsWith(`Unknown Last-Event-ID: ${lastEventId} (`), error.message);
    assert.match(error.message, why);
  }
  assert.deepEqual(mock.resumes().map((e) => [e.lastEventId, e.status, e.stream, e.replayed, e.session]), refused.map(([lastEventId, id]) => [lastEventId, 400, null, 0, id]));
  assert.match(mock.resumes()[0].rejected, /^Unknown Last-Event-ID/);

  // The session checks come first and answer as for any GET.
  assert.equal((await resume(mock, 'post-1:2')).status, 400, 'no session id');
  assert.equal((await resume(mock, 'post-1:2', { session: 'nope' })).status, 404, 'an unknown session');
  assert.equal((await resume(mock, 'post-1:2', { session: s.id, accept: 'application/json' })).status, 406);
  assert.equal((await resume(mock, 'post-1:2', { session: s.id, version: '2025-03-26' })).status, 400, 'another revision');
  assert.equal(mock.resumes().length, refused.length, 'those are `rejected` entries');
  assert.equal(mock.log().filter((e) => e.kind === 'rejected' && e.lastEventId === 'post-1:2').length, 4);

  // None of that touched the kept stream: it still resumes.
  const response = await resume(mock, 'post-1:2', { session: s.id });
  assert.equal(response.status, 200);
  staged.release();
  const { events } = await readToEnd(eventReader(response));
  assert.equal(events.at(-1).message.id, 12);
});

test('a_cut_waiting_for_events_that_never_come_happens_before_the_response', async (t) => {
  const mock = await startMockMcp({ resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);

  // `search` sends its response only: the cut comes first, the response is kept.
  mock.cutNextCallStream({ afterEvents: 1, close: true });
  const { events } = await readToEnd(eventReader(await post(mock, call(13, 'search', { query: 'refunds' }), { session: s.id })));
  assert.deepEqual(events, []);
  assert.deepEqual(mock.cuts().map((e) => [e.afterEvents, e.written]), [[1, 0]]);
  assert.deepEqual(mock.keptStreams().map((e) => [e.stream, e.events, e.answered]), [['post-1', 1, true]]);
  const rest = await readToEnd(eventReader(await resume(mock, 'post-1:0', { session: s.id })));
  assert.deepEqual(rest.events.map((e) => [e.id, e.retry, e.message.id]), [['post-1:1', 200, 13]]);

  // A question of the server's on a cut stream waits; the answer comes on the resumption.
  const asking = await startMockMcp({ resumable: true });
  t.after(() => asking.close());
  const a = await session(asking, '2025-06-18', ELICITING);
  asking.cutNextCallStream({ afterEvents: 1 });
  const cut = eventReader(await post(asking, { jsonrpc: '2.0', id: 14, method: 'tools/call', params: { name: 'check_availability', arguments: {} } }, { session: a.id }));
  const { events: [question], broke } = await readToEnd(cut);
  assert.ok(broke);
  assert.equal(question.id, 'post-1:1');
  assert.equal(question.message.method, 'elicitation/create');
  const answered = await post(asking, { jsonrpc: '2.0', id: question.message.id, result: { action: 'accept', content: { day: '2025-07-01' } } }, { session: a.id });
  assert.equal(answered.status, 202);
  await asking.waitFor((log) => log.some((e) => e.id === 14 && e.outcome === 'answered'), { timeout: 5000 });
  const after = await readToEnd(eventReader(await resume(asking, cut.lastEventId(), { session: a.id })));
  assert.deepEqual(after.events.map((e) => [e.id, e.message.result.content[0].text]), [['post-1:2', 'Tables free on 2025-07-01: 3']]);
});

test('reset_forgets_kept_streams_and_a_pending_cut_and_a_client_s_close_stops_an_uncut_call', async (t) => {
  const staged = stagedTool();
  const slowReport = demoTools({}).find((tool) => tool.name === 'slow_report');
  const mock = await startMockMcp({ tools: [staged.tool, slowReport], resumable: true });
  t.after(() => mock.close());
  let s = await session(mock);

  mock.cutNextCallStream({ afterEvents: 1 });
  await readToEnd(eventReader(await post(mock, call(15, 'staged'), { session: s.id })));
  assert.equal(mock.keptStreams().length, 1);
  mock.cutNextCallStream({ afterEvents: 1 });
  mock.reset();
  assert.deepEqual(mock.keptStreams(), []);

  s = await session(mock);
  staged.release();
  const { events, broke } = await readToEnd(eventReader(await post(mock, call(16, 'staged'), { session: s.id })));
  assert.equal(broke, null, 'no cut left over');
  assert.equal(events.at(-1).message.id, 16);
  assert.equal(events.at(-1).id, 'post-2:6', 'stream ids are never reused');
  assert.deepEqual(mock.cuts(), []);

  // A client that closes a stream nobody cut still stops the call, as without resumable.
  const controller = new AbortController();
  const dropped = eventReader(await post(mock, call(17, 'slow_report', { steps: 50 }), { session: s.id, signal: controller.signal }));
  assert.equal((await dropped.nextEvent()).id, 'post-3:1');
  controller.abort();
  await mock.waitFor((log) => log.some((e) => e.id === 17 && e.outcome === 'disconnected'), { timeout: 5000 });
  assert.deepEqual(mock.keptStreams(), []);
  assert.equal((await resume(mock, 'post-3:1', { session: s.id })).status, 400);
  assert.throws(() => mock.cutNextCallStream({ afterEvents: -1 }), /afterEvents/);
  assert.throws(() => mock.cutNextCallStream({ close: 'yes' }), /close/);
});

// --- GET streams (the server's announcements stream, opened by a plain GET) ---

/** A list_changed event of a GET stream, as written (resumable: with its id). */
const changedEvent = (id) => `event: message\n${id === null ? '' : `id: ${id}\n`}data: {"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n\n`;

/** Opens a plain GET stream of the session and reads its opening comment. */
async function openGetStream(mock, s, options = {}) {
  const response = await resume(mock, undefined, { session: s.id, ...options });
  assert.equal(response.status, 200);
  const reader = eventReader(response);
  assert.equal(await reader.saw(': open\n\n'), true);
  return reader;
}

/** DELETEs the session. */
const deleteSession = (mock, s) => fetch(mock.url, { method: 'DELETE', headers: { 'mcp-session-id': s.id, 'mcp-protocol-version': '2025-06-18' } });

test('a_get_stream_ended_by_close_streams_keeps_what_it_missed_and_a_resumption_replays_it_then_goes_on_live', async (t) => {
  const mock = await startMockMcp({ resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);

  const first = await openGetStream(mock, s);
  assert.equal(mock.notifyListChanged(), 1);
  assert.equal((await first.nextEvent()).id, 'get-1:1');
  assert.equal(mock.closeStreams(), 1);
  assert.deepEqual(await readToEnd(first), { events: [], broke: null }, 'ended cleanly');
  assert.equal(first.raw(), `: open\n\n${changedEvent('get-1:1')}`);
  assert.equal(mock.streamCount(), 0);
  assert.deepEqual(mock.streams().map((e) => [e.stream, e.closed, e.closedBy]), [[1, true, 'server']]);
  assert.deepEqual(mock.keptGetStreams(), [{ stream: 'get-1', number: 1, session: s.id, events: 1, kept: 1, detached: true, resumes: 0 }]);

  // Detached: what would be announced is kept, numbered on, not counted.
  assert.equal(mock.setTools(demoTools({ tickets: [], bookings: [] }).slice(0, 2)), 0);
  assert.equal(mock.notifyListChanged(), 0);
  assert.deepEqual(mock.sent().map((e) => [e.kind, e.method, e.session, e.stream, e.eventId, e.kept]), [
    ['sent', 'notifications/tools/list_changed', s.id, 1, 'get-1:1', undefined],
    ['sent', 'notifications/tools/list_changed', s.id, 1, 'get-1:2', true],
    ['sent', 'notifications/tools/list_changed', s.id, 1, 'get-1:3', true],
  ]);
  assert.equal(mock.sent()[1].headers['mcp-session-id'], s.id, 'the GET\'s headers');
  assert.equal(mock.keptGetStreams()[0].events, 3);

  // Resumed after the last id the client saw: the two it missed, as written, then live.
  const controller = new AbortController();
  const response = await resume(mock, first.lastEventId(), { session: s.id, signal: controller.signal });
  assert.equal(response.status, 200);
  assert.match(response.headers.get('content-type'), /^text\/event-stream/);
  const resumed = eventReader(response);
  assert.deepEqual([await resumed.nextEvent(), await resumed.nextEvent()], [
    { message: { jsonrpc: '2.0', method: 'notifications/tools/list_changed' }, id: 'get-1:2', retry: null },
    { message: { jsonrpc: '2.0', method: 'notifications/tools/list_changed' }, id: 'get-1:3', retry: null },
  ]);
  const [entry] = mock.resumes();
  assert.equal(entry.kind, 'resume');
  assert.equal(entry.method, 'GET');
  assert.equal(entry.lastEventId, 'get-1:1');
  assert.equal(entry.stream, 'get-1');
  assert.equal(entry.replayed, 2);
  assert.equal(entry.status, 200);
  assert.equal(entry.closed, false);
  assert.equal(entry.session, s.id);
  assert.equal(entry.headers['last-event-id'], 'get-1:1');
  assert.equal(entry.callId, undefined);
  assert.equal(entry.delivered, undefined, 'nothing to deliver on a GET stream');
  assert.equal(mock.streamCount(), 1, 'a resumed connection is open');
  assert.equal(mock.streamCount(s.id), 1);
  assert.equal(mock.streams().length, 1, 'no new stream: the same one, resumed');
  assert.deepEqual(mock.keptGetStreams().map((e) => [e.detached, e.resumes]), [[false, 1]]);

  assert.equal(mock.notifyListChanged(), 1, 'written live on the resumed stream');
  assert.equal((await resumed.nextEvent()).id, 'get-1:4', 'the numbering goes on');
  assert.equal(resumed.raw(), changedEvent('get-1:2') + changedEvent('get-1:3') + changedEvent('get-1:4'), 'exactly as first written, no opening comment');
  const live = mock.sent().at(-1);
  assert.deepEqual([live.stream, live.eventId, live.kept], [1, 'get-1:4', undefined]);
  assert.equal(live.headers['last-event-id'], 'get-1:1', 'the headers of the GET it went on');

  // The client closes it: detached again, still resumable.
  controller.abort();
  await mock.waitFor(() => entry.closed, { timeout: 5000, message: 'the resumed stream to be closed' });
  assert.equal(entry.closedBy, 'client');
  assert.equal(typeof entry.closedAt, 'number');
  assert.equal(mock.streamCount(), 0);
  assert.equal(mock.notifyListChanged(), 0);
  assert.deepEqual(mock.sent().at(-1).kept, true);
  const again = eventReader(await resume(mock, 'get-1:4', { session: s.id }));
  assert.deepEqual(await again.nextEvent(), { message: { jsonrpc: '2.0', method: 'notifications/tools/list_changed' }, id: 'get-1:5', retry: null });
  assert.deepEqual(mock.resumes().map((e) => [e.lastEventId, e.replayed, e.status]), [['get-1:1', 2, 200], ['get-1:4', 1, 200]]);
  again.cancel();
});

test('a_get_stream_broken_by_break_streams_is_resumed_the_same_way', async (t) => {
  const mock = await startMockMcp({ resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);

  const stream = await openGetStream(mock, s);
  // What was written goes out before the socket is destroyed.
  assert.equal(mock.notifyListChanged(), 1);
  assert.equal(mock.breakStreams(), 1);
  assert.equal(mock.streamCount(), 0, 'at once');
  const { events, broke } = await readToEnd(stream);
  assert.deepEqual(events.map((e) => e.id), ['get-1:1']);
  assert.ok(broke, 'a network error, not a clean end');
  assert.deepEqual(mock.streams().map((e) => [e.closed, e.closedBy]), [[true, 'server']]);
  assert.equal(mock.breakStreams(), 0);

  assert.equal(mock.notifyListChanged(), 0);
  assert.deepEqual(mock.sent().map((e) => [e.eventId, e.kept]), [['get-1:1', undefined], ['get-1:2', true]]);
  const resumed = eventReader(await resume(mock, stream.lastEventId(), { session: s.id }));
  assert.equal((await resumed.nextEvent()).id, 'get-1:2');
  assert.equal(mock.notifyListChanged(), 1);
  assert.equal((await resumed.nextEvent()).id, 'get-1:3');

  // A resumed stream breaks too, and is resumed again (nothing to replay: the headers come at once).
  assert.equal(mock.breakStreams(), 1);
  assert.ok((await readToEnd(resumed)).broke);
  assert.deepEqual([mock.resumes()[0].closed, mock.resumes()[0].closedBy], [true, 'server']);
  const third = eventReader(await resume(mock, 'get-1:3', { session: s.id }));
  assert.equal(mock.resumes()[1].replayed, 0);
  assert.equal(mock.notifyListChanged(), 1);
  assert.equal((await third.nextEvent()).id, 'get-1:4');
  third.cancel();
});

test('a_get_stream_resumption_is_refused_with_400_for_another_session_s_an_id_beyond_or_too_old_or_of_the_other_kind', async (t) => {
  const staged = stagedTool();
  const mock = await startMockMcp({ tools: [staged.tool], resumable: true });
  t.after(() => mock.close());
  const other = await session(mock);
  const s = await session(mock);
  await openGetStream(mock, other); // get-1
  await openGetStream(mock, s); // get-2
  assert.equal(mock.notifyListChanged(), 2);
  assert.equal(mock.closeStreams(), 2);
  mock.cutNextCallStream({ afterEvents: 2 });
  await readToEnd(eventReader(await post(mock, call(21, 'staged'), { session: s.id }))); // post-1, 2 events

  const refused = [
    ['get-1:1', s.id, /no such GET stream kept in this session/], // another session's
    ['get-2:2', s.id, /the stream has 1 events/], // beyond the count (post-1's 2 events are another stream's)
    ['get-9:0', s.id, /no such GET stream kept in this session/],
    ['get-2', s.id, /no such GET stream kept in this session/],
    ['get-post-1:1', s.id, /no such GET stream kept in this session/],
    ['post-2:1', s.id, /no such answer stream kept in this session/], // the GET stream's number as an answer stream's
  ];
  for (const [lastEventId, id, why] of refused) {
    const response = await resume(mock, lastEventId, { session: id });
    assert.equal(response.status, 400, lastEventId);
    const error = await refusal(response);
    assert.equal(error.code, -32600);
    assert.ok(error.message.startsWith(`Unknown Last-Event-ID: ${lastEventId} (`), error.message);
    assert.match(error.message, why);
  }
  assert.deepEqual(mock.resumes().map((e) => [e.kind, e.lastEventId, e.status, e.stream, e.replayed, e.session]), refused.map(([lastEventId, id]) => ['resume', lastEventId, 400, null, 0, id]));

  // The session checks come first and answer as for any GET.
  assert.equal((await resume(mock, 'get-2:1')).status, 400, 'no session id');
  assert.equal((await resume(mock, 'get-2:1', { session: 'nope' })).status, 404, 'an unknown session');
  assert.equal(mock.resumes().length, refused.length, 'those are `rejected` entries');

  // At most the last 100 events are kept: a resumption from before them is too old.
  for (let i = 0; i < 100; i += 1) assert.equal(mock.notifyListChanged(), 0);
  assert.deepEqual(mock.keptGetStreams().map((e) => [e.stream, e.session, e.events, e.kept]), [['get-1', other.id, 101, 100], ['get-2', s.id, 101, 100]]);
  const tooOld = await resume(mock, 'get-2:0', { session: s.id });
  assert.equal(tooOld.status, 400);
  assert.equal((await refusal(tooOld)).message, 'Unknown Last-Event-ID: get-2:0 (too old: the stream keeps its last 100 events, from get-2:2).');
  const oldest = eventReader(await resume(mock, 'get-2:1', { session: s.id }));
  const events = [];
  while (events.length < 100) events.push(await oldest.nextEvent());
  assert.deepEqual([events[0].id, events.at(-1).id], ['get-2:2', 'get-2:101']);
  assert.equal(mock.resumes().at(-1).replayed, 100);
  oldest.cancel();

  // None of that touched the answer stream: it still resumes.
  const response = await resume(mock, 'post-1:2', { session: s.id });
  assert.equal(response.status, 200);
  staged.release();
  assert.equal((await readToEnd(eventReader(response))).events.at(-1).message.id, 21);
});

test('without_resumable_a_get_stream_carries_no_ids_ends_for_good_and_last_event_id_is_ignored', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);

  const first = await openGetStream(mock, s);
  assert.equal(mock.notifyListChanged(), 1);
  assert.equal((await first.nextEvent()).id, null);
  assert.equal(first.raw(), `: open\n\n${changedEvent(null)}`);
  assert.equal(mock.closeStreams(), 1);
  assert.equal(mock.notifyListChanged(), 0);
  assert.deepEqual(mock.sent().map((e) => [e.stream, e.eventId, e.kept]), [[1, undefined, undefined]], 'nothing kept');
  assert.deepEqual(mock.keptGetStreams(), []);

  // Last-Event-ID means nothing: a new plain stream, nothing replayed.
  const second = eventReader(await resume(mock, 'get-1:0', { session: s.id }));
  assert.equal(await second.saw(': open\n\n'), true);
  assert.deepEqual(mock.streams().map((e) => e.stream), [1, 2]);
  assert.deepEqual(mock.resumes(), []);
  assert.equal(mock.notifyListChanged(), 1);
  assert.equal((await second.nextEvent()).id, null);

  // breakStreams breaks it all the same.
  assert.equal(mock.breakStreams(), 1);
  assert.ok((await readToEnd(second)).broke);
  assert.equal(mock.streamCount(), 0);
  assert.equal(mock.notifyListChanged(), 0);
});

test('a_get_stream_resumed_while_still_open_takes_over_its_connection_and_other_streams_keep_on_their_own', async (t) => {
  const mock = await startMockMcp({ resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);

  const first = await openGetStream(mock, s);
  assert.equal(mock.notifyListChanged(), 1);
  const missed = await first.nextEvent();

  // The client resumes from before that event while the stream is still open.
  const taking = eventReader(await resume(mock, 'get-1:0', { session: s.id }));
  assert.deepEqual(await taking.nextEvent(), missed, 'replayed as first written');
  assert.deepEqual(await readToEnd(first), { events: [], broke: null }, 'the earlier connection ended cleanly');
  assert.deepEqual(mock.streams().map((e) => [e.closed, e.closedBy]), [[true, 'server']]);
  assert.equal(mock.streamCount(), 1);
  assert.equal(mock.notifyListChanged(), 1, 'one stream, one connection: written once');
  assert.equal((await taking.nextEvent()).id, 'get-1:2');

  // A later resumption takes over the earlier one.
  const later = eventReader(await resume(mock, 'get-1:2', { session: s.id }));
  assert.deepEqual(await readToEnd(taking), { events: [], broke: null });
  assert.deepEqual(mock.resumes().map((e) => [e.lastEventId, e.replayed, e.closed, e.closedBy]), [['get-1:0', 1, true, 'server'], ['get-1:2', 0, false, undefined]]);
  assert.equal(mock.streamCount(), 1);

  // A new plain GET is a stream of its own; the detached one keeps on keeping.
  assert.equal(mock.closeStreams(), 1);
  const fresh = await openGetStream(mock, s);
  assert.equal(mock.notifyListChanged(), 1, 'written on the new stream only');
  assert.equal((await fresh.nextEvent()).id, 'get-2:1');
  assert.deepEqual(mock.sent().slice(-2).map((e) => [e.stream, e.eventId, e.kept]), [[1, 'get-1:3', true], [2, 'get-2:1', undefined]]);
  assert.deepEqual(mock.keptGetStreams().map((e) => [e.stream, e.events, e.detached]), [['get-1', 3, true], ['get-2', 1, false]]);
  const back = eventReader(await resume(mock, 'get-1:2', { session: s.id }));
  assert.equal((await back.nextEvent()).id, 'get-1:3');
  assert.equal(mock.streamCount(s.id), 2);
  await readToEnd(later);
  back.cancel();
  fresh.cancel();
});

test('delete_expire_and_reset_forget_a_session_s_kept_get_streams', async (t) => {
  const mock = await startMockMcp({ resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);
  const other = await session(mock);

  const mine = await openGetStream(mock, s);
  await openGetStream(mock, other);
  assert.equal(mock.closeStreams(), 2);
  assert.equal(mock.notifyListChanged(), 0);
  assert.equal(mock.keptGetStreams().length, 2);

  assert.equal((await deleteSession(mock, s)).status, 200);
  assert.deepEqual(mock.keptGetStreams().map((e) => [e.stream, e.session]), [['get-2', other.id]], 'the other session\'s stays');
  const before = mock.sent().length;
  assert.equal(mock.notifyListChanged(), 0);
  assert.deepEqual(mock.sent().slice(before).map((e) => [e.stream, e.eventId, e.kept]), [[2, 'get-2:2', true]], 'nothing kept for a forgotten stream');
  assert.equal((await resume(mock, 'get-1:0', { session: s.id })).status, 404, 'its session is gone');
  assert.equal(mine.raw(), ': open\n\n');

  // An open stream of a deleted session ends and is forgotten too.
  const third = await session(mock);
  const open = await openGetStream(mock, third);
  assert.equal((await deleteSession(mock, third)).status, 200);
  assert.deepEqual(await readToEnd(open), { events: [], broke: null });
  assert.deepEqual(mock.keptGetStreams().map((e) => e.stream), ['get-2']);

  mock.expireSessions();
  assert.deepEqual(mock.keptGetStreams(), []);
  const fourth = await session(mock);
  await openGetStream(mock, fourth);
  mock.reset();
  assert.deepEqual(mock.keptGetStreams(), []);
  assert.equal(mock.streamCount(), 0);
  const fifth = await session(mock);
  const refused = await resume(mock, 'get-4:0', { session: fifth.id });
  assert.equal(refused.status, 400);
  assert.match((await refusal(refused)).message, /no such GET stream kept in this session/);
  assert.equal((await openGetStream(mock, fifth)).raw(), ': open\n\n');
  assert.deepEqual(mock.streams().map((e) => e.stream), [5], 'stream numbers are never reused');
});

test('forget_kept_get_streams_ends_them_keeps_the_session_and_refuses_resuming_them', async (t) => {
  const mock = await startMockMcp({ resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);
  const open = await openGetStream(mock, s);
  assert.equal(mock.notifyListChanged(), 1);
  assert.equal(mock.forgetKeptGetStreams(), 1);
  const { events, broke } = await readToEnd(open);
  assert.equal(broke, null, 'ended cleanly');
  assert.deepEqual(events.map((e) => e.id), ['get-1:1']);
  assert.equal(mock.streamCount(), 0);
  assert.deepEqual(mock.keptGetStreams(), []);
  const refused = await resume(mock, 'get-1:1', { session: s.id });
  assert.equal(refused.status, 400, 'the session lives: not 404');
  assert.match((await refusal(refused)).message, /Unknown Last-Event-ID: get-1:1 \(no such GET stream kept in this session\)/);
  assert.equal((await openGetStream(mock, s)).raw(), ': open\n\n', 'a new stream opens in the same session');
});

// --- Forced refusals of resumptions (failNextResumptions) ---

test('fail_next_resumptions_refuses_the_next_resumptions_of_either_kind_then_they_succeed', async (t) => {
  const staged = stagedTool();
  const mock = await startMockMcp({ tools: [staged.tool], resumable: true });
  t.after(() => mock.close());
  const s = await session(mock);
  const stream = await openGetStream(mock, s);
  assert.equal(mock.notifyListChanged(), 1);
  assert.equal((await stream.nextEvent()).id, 'get-1:1');
  assert.equal(mock.closeStreams(), 1);
  assert.equal(mock.notifyListChanged(), 0, 'get-1:2 kept');
  assert.equal(mock.forcedResumptionsLeft(), 0);

  // 409, as the official TypeScript SDK answers a stream already connected; then a normal resumption.
  mock.failNextResumptions(409);
  assert.equal(mock.forcedResumptionsLeft(), 1);
  const conflict = await resume(mock, 'get-1:1', { session: s.id });
  assert.equal(conflict.status, 409);
  assert.deepEqual(await refusal(conflict), { code: -32000, message: 'Conflict: Stream already has an active connection' });
  assert.equal(mock.forcedResumptionsLeft(), 0);
  const forced = mock.log().at(-1);
  assert.deepEqual([forced.kind, forced.method, forced.lastEventId, forced.forced, forced.status, forced.session], ['rejected', 'GET', 'get-1:1', true, 409, s.id]);
  assert.deepEqual(mock.resumes(), [], 'not a resume entry');
  assert.deepEqual(mock.keptGetStreams().map((e) => [e.events, e.detached, e.resumes]), [[2, true, 0]], 'the stream untouched');
  const resumed = eventReader(await resume(mock, 'get-1:1', { session: s.id }));
  assert.equal((await resumed.nextEvent()).id, 'get-1:2');
  assert.deepEqual(mock.resumes().map((e) => [e.lastEventId, e.status, e.replayed]), [['get-1:1', 200, 1]]);
  resumed.cancel();

  // 500 twice (an answer stream's id, then a GET stream's in an unknown session: refused before the session checks), then the third succeeds.
  mock.cutNextCallStream({ afterEvents: 2 });
  await readToEnd(eventReader(await post(mock, call(31, 'staged'), { session: s.id })));
  mock.failNextResumptions(500, 2);
  assert.equal(mock.forcedResumptionsLeft(), 2);
  const plain = await openGetStream(mock, s); // a plain GET is not a resumption
  plain.cancel();
  assert.equal(mock.forcedResumptionsLeft(), 2);
  const first = await resume(mock, 'post-1:2', { session: s.id });
  assert.equal(first.status, 500);
  assert.deepEqual(await refusal(first), { code: -32000, message: 'Forced: HTTP 500.' });
  assert.equal(mock.forcedResumptionsLeft(), 1);
  const second = await resume(mock, 'get-1:2', { session: 'nope' });
  assert.equal(second.status, 500, 'not 404: before anything else');
  assert.equal((await refusal(second)).message, 'Forced: HTTP 500.');
  assert.equal(mock.forcedResumptionsLeft(), 0);
  assert.deepEqual(mock.log().filter((e) => e.forced).map((e) => [e.kind, e.lastEventId, e.status]), [['rejected', 'get-1:1', 409], ['rejected', 'post-1:2', 500], ['rejected', 'get-1:2', 500]]);
  const third = await resume(mock, 'post-1:2', { session: s.id });
  assert.equal(third.status, 200);
  staged.release();
  assert.equal((await readToEnd(eventReader(third))).events.at(-1).message.id, 31);

  // null cancels; a new call replaces the pending one.
  mock.failNextResumptions(503, 3);
  mock.failNextResumptions(502);
  assert.equal(mock.forcedResumptionsLeft(), 1);
  mock.failNextResumptions(null);
  assert.equal(mock.forcedResumptionsLeft(), 0);
  const normal = await resume(mock, 'get-1:9', { session: s.id });
  assert.equal(normal.status, 400);
  assert.match((await refusal(normal)).message, /^Unknown Last-Event-ID: get-1:9/);

  // Bad arguments throw, and leave nothing pending.
  for (const status of [399, 600, 500.5, '500', undefined, 200]) {
    assert.throws(() => mock.failNextResumptions(status), TypeError, String(status));
  }
  for (const count of [0, -1, 1.5, '2', null]) {
    assert.throws(() => mock.failNextResumptions(500, count), TypeError, String(count));
  }
  assert.equal(mock.forcedResumptionsLeft(), 0);

  // reset() cancels.
  mock.failNextResumptions(502, 5);
  mock.reset();
  assert.equal(mock.forcedResumptionsLeft(), 0);
  const fresh = await session(mock);
  const afterReset = await resume(mock, 'get-1:0', { session: fresh.id });
  assert.equal(afterReset.status, 400);
  assert.deepEqual(mock.log().filter((e) => e.forced), []);
});

test('fail_next_resumptions_counts_a_last_event_id_without_resumable_too', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  mock.failNextResumptions(404);
  const refused = await resume(mock, 'get-1:0', { session: s.id });
  assert.equal(refused.status, 404);
  assert.equal((await refusal(refused)).message, 'Forced: HTTP 404.');
  assert.deepEqual(mock.log().at(-1).forced, true);
  // Then, as ever without resumable, a plain GET.
  const plain = eventReader(await resume(mock, 'get-1:0', { session: s.id }));
  assert.equal(await plain.saw(': open\n\n'), true);
  plain.cancel();
});

// --- Polled GET streams (getStreamPolling) ---

/** getStreamPolling's priming event, as written. */
const primeEvent = (id, retry) => `id: ${id}\nretry: ${retry}\ndata: \n\n`;
/** Reads until the stream ends: true when it ended cleanly (a break rejects). */
const endsCleanly = async (reader) => !(await reader.saw('\u0000never written'));

test('get_stream_polling_primes_each_connection_ends_it_and_a_resumption_replays_then_primes_again', async (t) => {
  const mock = await startMockMcp({ resumable: true, getStreamPolling: { closeAfterMs: 150, retryMs: 1000 } });
  t.after(() => mock.close());
  const s = await session(mock);

  const stream = await openGetStream(mock, s);
  assert.equal(await stream.saw('data: \n\n'), true);
  const primedAt = Date.now();
  assert.equal(stream.raw(), `: open\n\n${primeEvent('get-1:1', 1000)}`, 'the comment, then id, retry, empty data');
  assert.equal(await endsCleanly(stream), true);
  assert.ok(Date.now() - primedAt >= 100, `ended closeAfterMs after the priming, not at once (${Date.now() - primedAt} ms)`);
  assert.equal(stream.raw(), `: open\n\n${primeEvent('get-1:1', 1000)}`, 'nothing else');
  assert.deepEqual(mock.streams().map((e) => [e.stream, e.closed, e.closedBy]), [[1, true, 'server']]);
  const [{ headers, ...prime }] = mock.log().filter((e) => e.kind === 'prime');
  assert.deepEqual(prime, { kind: 'prime', stream: 1, eventId: 'get-1:1', session: s.id });
  assert.equal(headers['mcp-session-id'], s.id, 'the GET\'s headers');
  assert.deepEqual(mock.log().filter((e) => e.kind === 'stream' || e.kind === 'prime').map((e) => e.kind), ['stream', 'prime'], 'the stream entry first');
  assert.deepEqual(mock.keptGetStreams(), [{ stream: 'get-1', number: 1, session: s.id, events: 1, kept: 1, detached: true, resumes: 0 }]);
  assert.deepEqual(mock.sent(), [], 'a priming is no `sent` entry');

  // Detached: a notification is kept.
  assert.equal(mock.notifyListChanged(), 0);
  assert.deepEqual(mock.sent().map((e) => [e.stream, e.eventId, e.kept]), [[1, 'get-1:2', true]]);

  // Resumed after the priming id: the notification, then a new priming (the next number), then the end again.
  const resumed = eventReader(await resume(mock, 'get-1:1', { session: s.id }));
  assert.deepEqual(await resumed.nextEvent(), { message: { jsonrpc: '2.0', method: 'notifications/tools/list_changed' }, id: 'get-1:2', retry: null });
  assert.equal(await endsCleanly(resumed), true);
  assert.equal(resumed.raw(), changedEvent('get-1:2') + primeEvent('get-1:3', 1000));
  assert.deepEqual(mock.resumes().map((e) => [e.lastEventId, e.stream, e.replayed, e.status, e.closed, e.closedBy]), [['get-1:1', 'get-1', 1, 200, true, 'server']]);
  assert.deepEqual(mock.log().filter((e) => e.kind === 'prime').map((e) => [e.eventId, e.headers['last-event-id']]), [['get-1:1', undefined], ['get-1:3', 'get-1:1']]);
  assert.deepEqual(mock.keptGetStreams().map((e) => [e.events, e.kept, e.detached, e.resumes]), [[3, 3, true, 1]]);

  // Nothing missed: the priming alone. From before the first priming: it is kept and replayed as written.
  const nothing = eventReader(await resume(mock, 'get-1:3', { session: s.id }));
  assert.equal(await endsCleanly(nothing), true);
  assert.equal(nothing.raw(), primeEvent('get-1:4', 1000));
  const all = eventReader(await resume(mock, 'get-1:0', { session: s.id }));
  assert.equal(await endsCleanly(all), true);
  assert.equal(all.raw(), primeEvent('get-1:1', 1000) + changedEvent('get-1:2') + primeEvent('get-1:3', 1000) + primeEvent('get-1:4', 1000) + primeEvent('get-1:5', 1000));
  assert.deepEqual(mock.resumes().map((e) => e.replayed), [1, 0, 4]);
});

test('get_stream_polling_writes_live_while_open_and_its_option_is_checked_at_start_up', async (t) => {
  const mock = await startMockMcp({ resumable: true, getStreamPolling: { closeAfterMs: 60_000, retryMs: 0 } });
  t.after(() => mock.close());
  const s = await session(mock);
  const stream = await openGetStream(mock, s);
  assert.equal(await stream.saw(primeEvent('get-1:1', 0)), true);
  assert.equal(mock.notifyListChanged(), 1, 'open: written live');
  assert.equal(await stream.saw(changedEvent('get-1:2')), true);
  assert.equal(mock.streamCount(), 1);
  // Ended earlier (closeStreams): cleanly, as any; its 60 s timer goes with it (the test run does not wait on it).
  assert.equal(mock.closeStreams(), 1);
  assert.equal(await endsCleanly(stream), true);
  assert.equal(stream.raw(), `: open\n\n${primeEvent('get-1:1', 0)}${changedEvent('get-1:2')}`);

  await assert.rejects(startMockMcp({ getStreamPolling: { closeAfterMs: 10, retryMs: 10 } }), /getStreamPolling needs resumable/);
  for (const bad of [
    { closeAfterMs: -1, retryMs: 0 },
    { closeAfterMs: Infinity, retryMs: 0 },
    { closeAfterMs: '10', retryMs: 0 },
    { closeAfterMs: 10, retryMs: 1.5 },
    { closeAfterMs: 10, retryMs: -1 },
    { closeAfterMs: 10 },
    { retryMs: 10 },
    { closeAfterMs: 10, retryMs: 10, every: 1 },
    'yes',
    [10, 10],
  ]) {
    await assert.rejects(startMockMcp({ resumable: true, getStreamPolling: bad }), /getStreamPolling/, JSON.stringify(bad));
  }
  const off = await startMockMcp({ resumable: true, getStreamPolling: null });
  t.after(() => off.close());
  const o = await session(off);
  const plain = await openGetStream(off, o);
  assert.equal(off.notifyListChanged(), 1);
  assert.equal(await plain.saw(changedEvent('get-1:1')), true);
  assert.equal(plain.raw(), `: open\n\n${changedEvent('get-1:1')}`, 'null: no priming');
  plain.cancel();
});
