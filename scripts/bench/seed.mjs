// Seeded threads for the history benchmarks, in the engine's record shapes
// (src/model.rs `Thread` / `Node`, camelCase JSON, as src/platform/idb.rs
// stores them in the `threads` and `nodes` object stores of "sw-agent").
//
// A thread of about `length` nodes: a turn context and a user message, then
// (assistant message → tool_call → tool_result) triples of small realistic
// text, and a final answer — the same shape as `seeded_nodes` in
// benches/native.rs. Writing records directly is much faster than scripting
// thousands of real steps, and a fresh worker loads them like any thread.

export const ENGINE_DB = 'sw-agent';

/** { thread, nodes } for thread `id` with about `length` nodes (at least 5). */
export function seededThread(id, length, { model = 'mock-1', createdAt = Date.now() - 60000 } = {}) {
  const nodes = [];
  const push = (body) => {
    const node = {
      id: `${id}-n${nodes.length}`,
      threadId: id,
      parentId: nodes.length ? nodes[nodes.length - 1].id : null,
      createdAt: createdAt + nodes.length,
      ...body,
    };
    nodes.push(node);
    return node;
  };
  push({ kind: 'turn_context', turnId: `${id}-turn`, model });
  push({ kind: 'user_message', text: 'Look at the page and tell me what is on sale.', steered: false });
  for (let i = 0; nodes.length + 3 < Math.max(length, 5); i += 1) {
    const assistant = push({
      kind: 'assistant_message',
      text: `Step ${i}: let me look at the page outline again.`,
      stopReason: 'tool_use',
      interrupted: false,
      model,
    });
    push({
      kind: 'tool_call',
      callId: `call_${id}_${i}`,
      assistantId: assistant.id,
      name: 'page_snapshot',
      label: 'Page outline',
      arguments: {},
    });
    push({
      kind: 'tool_result',
      callId: `call_${id}_${i}`,
      name: 'page_snapshot',
      status: 'ok',
      content: `Title: Shop (step ${i})\n[e1] button "Subscribe"\n[e2] link "Sale"\nMain: Spring sale, 20% off shoes.`,
    });
  }
  push({ kind: 'assistant_message', text: 'Shoes are 20% off.', stopReason: 'end', interrupted: false, model });
  const thread = {
    id,
    title: `Seeded ${length}`,
    leafId: nodes[nodes.length - 1].id,
    createdAt,
    updatedAt: createdAt,
    revision: 1,
    parentThreadId: null,
    usage: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, reasoning: 0 },
    // One linear path: what the engine stamps on every thread record it writes.
    pathLen: nodes.length,
  };
  return { thread, nodes };
}

/** A mock LLM script: `steps` steps that each call `page_snapshot`, then a final answer. */
export function snapshotStepsScript(steps) {
  return [
    ...Array.from({ length: steps }, () => ({ toolCalls: [{ name: 'page_snapshot', arguments: {} }] })),
    { text: 'Done.' },
  ];
}
