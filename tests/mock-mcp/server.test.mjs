// Tests of the mock MCP server's wire format: what the engine's MCP client
// is tested against must itself behave like a Streamable HTTP server.
//
// Run:  node --test tests/mock-mcp/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BOOKING_MESSAGE, BOOKING_SCHEMA, startMockMcp } from './server.mjs';
import { eventReader, messages, post, session } from './client.mjs';

test('initialize_agrees_on_a_revision_and_later_messages_need_the_session_and_its_version', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  assert.equal((await session(mock, '2025-03-26')).version, '2025-03-26');
  const s = await session(mock, '1999-01-01');
  assert.equal(s.version, '2025-06-18', 'an unknown revision gets the server\'s latest');

  const list = { jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} };
  assert.equal((await post(mock, list)).status, 400, 'no session id');
  assert.equal((await post(mock, list, { session: 'nope' })).status, 404, 'an unknown session');
  assert.equal((await post(mock, list, { session: s.id, version: null })).status, 400, 'no MCP-Protocol-Version');
  assert.equal((await post(mock, list, { session: s.id, accept: 'application/json' })).status, 406);
  assert.equal((await post(mock, list, { session: s.id })).status, 200);

  mock.expireSessions();
  assert.equal((await post(mock, list, { session: s.id })).status, 404, 'a forgotten session');
});

test('tools_list_comes_in_pages_without_the_run_functions', async (t) => {
  const mock = await startMockMcp({ pageSize: 2 });
  t.after(() => mock.close());
  const s = await session(mock);
  const names = [];
  let cursor;
  let pages = 0;
  do {
    const [answer] = await messages(await post(mock, { jsonrpc: '2.0', id: 10 + pages, method: 'tools/list', params: cursor ? { cursor } : {} }, { session: s.id }));
    for (const tool of answer.result.tools) {
      assert.equal(tool.run, undefined);
      assert.equal(tool.inputSchema.type, 'object');
      names.push(tool.name);
    }
    cursor = answer.result.nextCursor;
    pages += 1;
  } while (cursor);
  assert.deepEqual(names, ['search', 'create_ticket', 'slow_report', 'broken', 'ask_model', 'book_table', 'check_availability', 'add_faq_tool']);
  assert.equal(pages, 4);
});

test('a_call_streams_progress_then_its_result_and_a_json_server_answers_in_one_body', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  const call = { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'slow_report', arguments: { steps: 2 }, _meta: { progressToken: 'tok' } } };
  const stream = await messages(await post(mock, call, { session: s.id }));
  assert.deepEqual(stream.map((m) => m.method ?? 'result'), ['notifications/progress', 'notifications/progress', 'result']);
  assert.deepEqual(stream[1].params, { progressToken: 'tok', progress: 2, total: 2, message: 'Step 2 of 2' });
  assert.equal(stream[2].id, 7);
  assert.equal(stream[2].result.content[0].text, 'The report has 2 sections.');

  const json = await startMockMcp({ answer: 'json' });
  t.after(() => json.close());
  const j = await session(json);
  const [answer] = await messages(await post(json, { ...call, params: { name: 'create_ticket', arguments: { subject: 'Broken login' } } }, { session: j.id }));
  assert.equal(answer.result.content[0].text, 'Opened ticket T-1: Broken login');
  assert.deepEqual(json.tickets(), ['Broken login']);
});

test('a_cancelled_call_stops_and_a_server_request_waits_for_the_client_s_answer', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  const slow = post(mock, { jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'slow_report', arguments: { steps: 100 } } }, { session: s.id });
  await mock.waitFor((log) => log.some((e) => e.tool === 'slow_report'));
  const cancelled = await post(mock, { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 3, reason: 'given up' } }, { session: s.id });
  assert.equal(cancelled.status, 202);
  await mock.waitFor((log) => log.some((e) => e.tool === 'slow_report' && e.outcome === 'cancelled'));
  const [error] = (await messages(await slow)).filter((m) => m.id === 3);
  assert.equal(error.error.code, -32603);
  assert.equal(mock.cancellations()[0].params.requestId, 3);

  const asking = post(mock, { jsonrpc: '2.0', id: 4, method: 'tools/call', params: { name: 'ask_model', arguments: {} } }, { session: s.id });
  const response = await asking;
  const reader = response.body.getReader();
  const { value } = await reader.read();
  const request = JSON.parse(new TextDecoder().decode(value).split('data: ')[1]);
  assert.equal(request.method, 'sampling/createMessage');
  const refused = await post(mock, { jsonrpc: '2.0', id: request.id, error: { code: -32601, message: 'Method not found' } }, { session: s.id });
  assert.equal(refused.status, 202);
  let rest = '';
  for (;;) {
    const { value: more, done } = await reader.read();
    if (done) break;
    rest += new TextDecoder().decode(more);
  }
  assert.match(rest, /The client refused: -32601 Method not found/);
  assert.equal(mock.responses().length, 1);
});

const ELICITING = { elicitation: {} };
const bookTable = (id, args = { date: '2025-07-01' }) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'book_table', arguments: args } });

test('book_table_asks_the_client_on_the_call_s_stream_and_answers_after_the_client_s_accept', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock, '2025-06-18', ELICITING);
  const stream = eventReader(await post(mock, bookTable(5), { session: s.id }));

  const request = await stream.next();
  assert.equal(request.jsonrpc, '2.0');
  assert.equal(request.id, 'elicit-1');
  assert.equal(request.method, 'elicitation/create');
  assert.equal(request.params.message, BOOKING_MESSAGE);
  assert.deepEqual(request.params.requestedSchema, BOOKING_SCHEMA);
  const kinds = Object.values(request.params.requestedSchema.properties).map((p) => [p.type, p.format ?? (p.enum ? 'enum' : '')]);
  assert.deepEqual(kinds, [['string', ''], ['string', 'email'], ['integer', ''], ['string', 'enum'], ['boolean', '']]);
  assert.deepEqual(request.params.requestedSchema.properties.seating.enumNames, ['Indoors', 'On the terrace', 'At the bar']);

  // The wait is observable: the question in the log, no answer yet.
  await mock.waitFor((log) => log.some((e) => e.kind === 'elicitation' && e.id === 'elicit-1'));
  const [asked] = mock.elicitations();
  assert.equal(asked.callId, 5);
  assert.equal(asked.tool, 'book_table');
  assert.equal(asked.session, s.id);
  assert.equal(asked.answered, false);
  assert.deepEqual(mock.elicitationResponses(), []);
  assert.equal(mock.calls()[0].outcome, undefined, 'the call still runs');

  const content = { name: 'Ada Lovelace', email: 'ada@example.com', partySize: 4, seating: 'terrace', highChair: true };
  const answered = await post(mock, { jsonrpc: '2.0', id: 'elicit-1', result: { action: 'accept', content } }, { session: s.id });
  assert.equal(answered.status, 202);
  assert.equal(await answered.text(), '', 'no body');

  const result = await stream.next();
  assert.equal(result.id, 5);
  assert.equal(result.result.content[0].text, 'Booked for 4 on 2025-07-01 (name: Ada Lovelace, email: ada@example.com, seating: terrace, high chair: yes)');
  assert.equal(result.result.isError, undefined);
  assert.equal(await stream.next(), null, 'the stream ends with the result');

  const [response] = mock.elicitationResponses();
  assert.equal(response.id, 'elicit-1');
  assert.equal(response.action, 'accept');
  assert.deepEqual(response.content, content);
  assert.equal(response.status, 202);
  assert.equal(response.late, false);
  // The answer carries the session's headers, in the session that was asked.
  assert.equal(response.session, s.id);
  assert.equal(response.requestSession, s.id);
  assert.equal(response.headers['mcp-protocol-version'], '2025-06-18');
  assert.equal(mock.elicitations()[0].answered, true);
  assert.deepEqual(mock.responses(), [response], 'listed with the client\'s answers');
  assert.deepEqual(mock.bookings(), [{ date: '2025-07-01', ...content }]);
  assert.equal(mock.calls()[0].outcome, 'answered');
});

test('a_declined_cancelled_or_ill_typed_answer_is_said_in_the_result', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock, '2025-06-18', ELICITING);
  const answers = [
    [{ action: 'decline' }, 'Booking declined', undefined],
    [{ action: 'cancel' }, 'Booking cancelled', undefined],
    [{ action: 'accept', content: { name: 'Ada', email: 'ada@example.com', partySize: '4' } }, 'Invalid booking: partySize is not an integer: "4"', true],
    [{ action: 'accept', content: { name: 'Ada', email: 'ada@example.com', partySize: 2 } }, 'Booked for 2 (name: Ada, email: ada@example.com)', undefined],
  ];
  for (const [index, [answer, text, isError]] of answers.entries()) {
    const stream = eventReader(await post(mock, bookTable(20 + index, {}), { session: s.id }));
    const request = await stream.next();
    assert.equal(request.id, `elicit-${index + 1}`);
    assert.equal((await post(mock, { jsonrpc: '2.0', id: request.id, result: answer }, { session: s.id })).status, 202);
    const result = await stream.next();
    assert.equal(result.result.content[0].text, text);
    assert.equal(result.result.isError, isError);
  }
  assert.deepEqual(mock.elicitationResponses().map((e) => e.action), ['decline', 'cancel', 'accept', 'accept']);
  assert.equal(mock.bookings().length, 1);
});

test('a_client_without_the_elicitation_capability_is_not_asked', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock);
  const [result] = (await messages(await post(mock, bookTable(9), { session: s.id }))).filter((m) => m.id === 9);
  assert.equal(result.result.isError, true);
  assert.match(result.result.content[0].text, /cannot answer questions/);
  assert.deepEqual(mock.elicitations(), []);
});

test('a_call_cancelled_or_dropped_while_its_question_waits_stops_waiting', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  const s = await session(mock, '2025-06-18', ELICITING);

  // Cancelled: the call ends with an error, a late answer changes nothing.
  const stream = eventReader(await post(mock, bookTable(30), { session: s.id }));
  const request = await stream.next();
  const cancelled = await post(mock, { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 30, reason: 'the user stopped' } }, { session: s.id });
  assert.equal(cancelled.status, 202);
  await mock.waitFor((log) => log.some((e) => e.tool === 'book_table' && e.outcome === 'cancelled'), { timeout: 5000 });
  const end = await stream.next();
  assert.equal(end.id, 30);
  assert.equal(end.error.code, -32603);
  const late = await post(mock, { jsonrpc: '2.0', id: request.id, result: { action: 'accept', content: { name: 'Ada', email: 'a@b.c', partySize: 2 } } }, { session: s.id });
  assert.equal(late.status, 202);
  const [response] = mock.elicitationResponses();
  assert.equal(response.late, true, 'nothing waited for it any more');
  assert.deepEqual(mock.bookings(), []);

  // Dropped: the client closes the call's stream (its worker died).
  const controller = new AbortController();
  const dropped = eventReader(await post(mock, bookTable(31), { session: s.id, signal: controller.signal }));
  assert.equal((await dropped.next()).method, 'elicitation/create');
  controller.abort();
  await mock.waitFor((log) => log.some((e) => e.tool === 'book_table' && e.id === 31 && e.outcome === 'disconnected'), { timeout: 5000 });
  assert.deepEqual(mock.elicitations().map((e) => [e.callId, e.answered]), [[30, true], [31, false]]);
});
