// The e2e suites' provider-request check (`orphanToolCallProblems`) in both
// wire formats: it must flag what the real APIs refuse with a 400.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { orphanToolCallProblems } from './session.mjs';

const openai = (messages) => ({ index: 0, format: 'openai', body: { messages } });
const anthropic = (messages) => ({ index: 0, format: 'anthropic', body: { messages } });

test('openai: a call answered once passes; a missing or doubled result is flagged', () => {
  const call = { role: 'assistant', content: null, tool_calls: [{ id: 'c1', function: { name: 'read_page' } }] };
  const result = { role: 'tool', tool_call_id: 'c1', content: 'ok' };
  assert.deepEqual(orphanToolCallProblems([openai([{ role: 'user', content: 'go' }, call, result])]), []);
  assert.equal(orphanToolCallProblems([openai([{ role: 'user', content: 'go' }, call])]).length, 1);
  assert.equal(orphanToolCallProblems([openai([{ role: 'user', content: 'go' }, call, result, result])]).length, 1);
});

test('anthropic: results must come in the next user message, once, for calls just made', () => {
  const call = { role: 'assistant', content: [{ type: 'text', text: 'Reading.' }, { type: 'tool_use', id: 'u1', name: 'read_page', input: {} }] };
  const result = (id = 'u1') => ({ role: 'user', content: [{ type: 'tool_result', tool_use_id: id, content: 'ok' }] });
  const user = { role: 'user', content: 'go' };
  assert.deepEqual(orphanToolCallProblems([anthropic([user, call, result()])]), []);
  assert.match(orphanToolCallProblems([anthropic([user, call])])[0], /u1 .* 0 results/);
  // A result one message too late is as bad as none.
  const late = orphanToolCallProblems([anthropic([user, call, { role: 'assistant', content: 'hm' }, result()])]);
  assert.equal(late.length, 2, late.join('\n'));
  assert.match(orphanToolCallProblems([anthropic([user, result('u9')])])[0], /u9 answers no call/);
  const doubled = { role: 'user', content: [...result().content, ...result().content] };
  assert.match(orphanToolCallProblems([anthropic([user, call, doubled])])[0], /2 results/);
});
