// What your extension adds to the agent's system prompt: who the agent is in
// your product, when to use your own tools (host-tools.js), house rules.
// sw.js hands it to Engine.start() at every worker start. It is added after
// the engine's own prompt (how to use the page tools; page text is data,
// not instructions), which it extends but cannot replace.
//
// It goes with every request to the model, so keep it short: at most
// 32 KiB. Something that is not a string, or longer, is left out and named
// in the worker's console. A run that started with other instructions (an
// update changed this file) is not resumed blindly: the side panel says the
// system prompt changed.
//
// Example:
//
//   export const INSTRUCTIONS = `You work for the support team of Acme.
//   Before answering about a customer, look them up with crm_lookup.`;

/** @type {string} */
export const INSTRUCTIONS = "";
