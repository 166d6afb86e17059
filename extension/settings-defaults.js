// Your extension's provider settings: what the engine uses for every field
// the user has not set in the side panel's Settings. sw.js hands them to
// Engine.start() at every worker start; the side panel shows them in its
// form. A field the user saves with another value wins over the default;
// the panel stores only what differs from it, so a default you change in an
// update reaches every user who did not choose otherwise. An empty field
// in the panel takes the default again. The engine checks each field; a
// wrong one is left out (the others apply) and the worker's console names
// it and what to fix.
//
// Fields (all optional):
//   provider         "openai" (any OpenAI-compatible chat completions API)
//                    or "anthropic" (the Messages API)
//   baseUrl          http(s) address of the API, e.g. "https://llm.example.com/v1"
//   model            the model name
//   maxOutputTokens  whole number, 1 to 1000000
//   temperature      0 to 2
//   toolUse          false if the model cannot call tools (default true)
//   vision           true if the model sees images (default false)
//   contextWindow    the model's context window in tokens (at least 1000)
//   tokenBudget      tokens a run may spend before it pauses
//
// Not `apiKey`: anyone who installs an extension can read its files. Let
// each user enter their key in Settings, or put a proxy that authenticates
// your users at `baseUrl`.
//
// Example:
//
//   export const SETTINGS_DEFAULTS = {
//     provider: "openai",
//     baseUrl: "https://llm.example.com/v1",
//     model: "gpt-4o-mini",
//     contextWindow: 128000,
//   };

/** @type {Record<string, unknown>} */
export const SETTINGS_DEFAULTS = {};
