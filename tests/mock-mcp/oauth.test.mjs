// Tests of the mock MCP server's OAuth 2.1 authorization server (option
// `auth`): what the engine's MCP client signs in against must behave like
// the MCP authorization spec (2025-06-18) says: protected resource metadata
// (RFC 9728), authorization server metadata (RFC 8414), dynamic client
// registration (RFC 7591), the authorization code grant with PKCE S256
// (RFC 7636) and resource indicators (RFC 8707), refresh token rotation;
// and for servers without registration (`registration: false`),
// pre-registered clients (`clients`) and Client ID Metadata Documents
// (`clientMetadataDocuments`, MCP 2025-11-25), which the mock serves itself.
//
// Run:  node --test tests/mock-mcp/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { startMockMcp } from './server.mjs';

const ACCEPT = 'application/json, text/event-stream';
const REDIRECT = 'https://abcdefghijklmnop.chromiumapp.org/mcp-oauth';
const INITIALIZE = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '1' } } };

async function post(mock, message, { token, session } = {}) {
  const headers = { 'content-type': 'application/json', accept: ACCEPT };
  if (token) headers.authorization = `Bearer ${token}`;
  if (session) {
    headers['mcp-session-id'] = session;
    headers['mcp-protocol-version'] = '2025-06-18';
  }
  return fetch(mock.url, { method: 'POST', headers, body: JSON.stringify(message) });
}

/** A PKCE pair, the challenge computed here (not with the mock's helper). */
function pkce() {
  const verifier = randomBytes(32).toString('base64url');
  const challenge = createHash('sha256').update(verifier).digest('base64')
    .replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  return { verifier, challenge };
}

async function register(mock, body = { redirect_uris: [REDIRECT], client_name: 'Test Extension' }, contentType = 'application/json') {
  return fetch(`${mock.origin}/register`, { method: 'POST', headers: { 'content-type': contentType }, body: typeof body === 'string' ? body : JSON.stringify(body) });
}

async function client(mock) {
  const response = await register(mock);
  assert.equal(response.status, 201);
  return response.json();
}

function authorizeUrl(mock, clientId, challenge, overrides = {}) {
  const url = new URL(`${mock.origin}/authorize`);
  const params = {
    response_type: 'code',
    client_id: clientId,
    redirect_uri: REDIRECT,
    code_challenge: challenge,
    code_challenge_method: 'S256',
    state: 'st-123',
    resource: mock.url,
    ...overrides,
  };
  for (const [name, value] of Object.entries(params)) if (value !== undefined) url.searchParams.set(name, value);
  return url.href;
}

const get = (url) => fetch(url, { redirect: 'manual' });

/** The query of a 302's Location, which must lead to `REDIRECT`. */
function redirected(response) {
  assert.equal(response.status, 302);
  const location = new URL(response.headers.get('location'));
  assert.equal(`${location.origin}${location.pathname}`, REDIRECT);
  return Object.fromEntries(location.searchParams);
}

async function token(mock, form) {
  return fetch(`${mock.origin}/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams(form).toString(),
  });
}

const exchange = (mock, clientId, code, verifier, overrides = {}) => token(mock, {
  grant_type: 'authorization_code',
  code,
  redirect_uri: REDIRECT,
  client_id: clientId,
  code_verifier: verifier,
  resource: mock.url,
  ...overrides,
});

const refresh = (mock, clientId, refreshToken) => token(mock, { grant_type: 'refresh_token', refresh_token: refreshToken, client_id: clientId, resource: mock.url });

/** Registers, signs in with autoApprove (`overrides`: of the authorization request) and exchanges the code: → { client, tokens }. */
async function signIn(mock, overrides = {}) {
  mock.setAutoApprove(true);
  const c = await client(mock);
  const { verifier, challenge } = pkce();
  const { code } = redirected(await get(authorizeUrl(mock, c.client_id, challenge, overrides)));
  const response = await exchange(mock, c.client_id, code, verifier);
  assert.equal(response.status, 200);
  return { client: c, tokens: await response.json() };
}

async function assertOAuthError(response, status, error) {
  assert.equal(response.status, status);
  const body = await response.json();
  assert.equal(body.error, error, JSON.stringify(body));
  assert.equal(typeof body.error_description, 'string');
  return body;
}

/** `initialize` then `notifications/initialized` with the token: the session's id. */
async function openSession(mock, accessToken) {
  const init = await post(mock, INITIALIZE, { token: accessToken });
  assert.equal(init.status, 200);
  const session = init.headers.get('mcp-session-id');
  assert.equal((await post(mock, { jsonrpc: '2.0', method: 'notifications/initialized' }, { token: accessToken, session })).status, 202);
  return session;
}

const callTool = (mock, accessToken, session, id, name, args) => post(mock, { jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } }, { token: accessToken, session });

function assertUnauthorized(mock, response, invalid) {
  assert.equal(response.status, 401);
  const metadata = `${mock.origin}/.well-known/oauth-protected-resource/mcp`;
  assert.equal(response.headers.get('www-authenticate'), `Bearer resource_metadata="${metadata}"${invalid ? ', error="invalid_token"' : ''}`);
}

test('without_auth_nothing_changes_and_the_oauth_paths_are_404', async (t) => {
  const mock = await startMockMcp();
  t.after(() => mock.close());
  assert.equal(mock.auth, null);
  assert.equal((await post(mock, INITIALIZE)).status, 200);
  for (const path of ['/.well-known/oauth-protected-resource/mcp', '/.well-known/oauth-authorization-server', '/authorize', '/token', '/register']) {
    assert.equal((await fetch(`${mock.origin}${path}`)).status, 404, path);
  }
  assert.deepEqual(mock.authLog(), []);
});

test('mcp_answers_401_with_the_resource_metadata_before_sign_in', async (t) => {
  const mock = await startMockMcp({ auth: true });
  t.after(() => mock.close());

  const response = await post(mock, INITIALIZE);
  assertUnauthorized(mock, response, false);
  const body = await response.json();
  assert.equal(body.jsonrpc, '2.0');
  assert.equal(body.id, null);
  assert.match(body.error.message, /^Unauthorized/);

  // GET and DELETE too, before the session checks; a non-Bearer scheme is no token.
  assertUnauthorized(mock, await fetch(mock.url, { headers: { accept: 'text/event-stream' } }), false);
  assertUnauthorized(mock, await fetch(mock.url, { method: 'DELETE', headers: { 'mcp-session-id': 'x' } }), false);
  assertUnauthorized(mock, await fetch(mock.url, { method: 'POST', headers: { authorization: 'Basic abc', 'content-type': 'application/json', accept: ACCEPT }, body: JSON.stringify(INITIALIZE) }), false);
  // A token not of this server's.
  assertUnauthorized(mock, await post(mock, INITIALIZE, { token: 'forged' }), true);

  const rejected = mock.log();
  assert.deepEqual(rejected.map((e) => [e.kind, e.status, e.method, e.authError]), [
    ['rejected', 401, 'initialize', 'missing'],
    ['rejected', 401, 'GET', 'missing'],
    ['rejected', 401, 'DELETE', 'missing'],
    ['rejected', 401, 'initialize', 'missing'],
    ['rejected', 401, 'initialize', 'invalid_token'],
  ]);
  assert.equal(rejected[4].headers.authorization, 'Bearer forged');
  assert.equal(mock.sessionCount(), 0);
});

test('both_metadata_documents_and_cors', async (t) => {
  const mock = await startMockMcp({ auth: { scopes: ['tools', 'admin'] } });
  t.after(() => mock.close());

  const resource = await fetch(`${mock.origin}/.well-known/oauth-protected-resource/mcp`);
  assert.equal(resource.status, 200);
  assert.equal(resource.headers.get('access-control-allow-origin'), '*');
  assert.deepEqual(await resource.json(), {
    resource: mock.url,
    authorization_servers: [mock.origin],
    scopes_supported: ['tools', 'admin'],
    bearer_methods_supported: ['header'],
  });

  const as = await fetch(`${mock.origin}/.well-known/oauth-authorization-server`);
  assert.equal(as.status, 200);
  assert.equal(as.headers.get('access-control-allow-origin'), '*');
  assert.deepEqual(await as.json(), {
    issuer: mock.origin,
    authorization_endpoint: `${mock.origin}/authorize`,
    token_endpoint: `${mock.origin}/token`,
    registration_endpoint: `${mock.origin}/register`,
    response_types_supported: ['code'],
    grant_types_supported: ['authorization_code', 'refresh_token'],
    code_challenge_methods_supported: ['S256'],
    token_endpoint_auth_methods_supported: ['none'],
    scopes_supported: ['tools', 'admin'],
  });
  assert.equal(mock.auth.issuer, mock.origin);
  assert.equal(mock.auth.resourceMetadataUrl, `${mock.origin}/.well-known/oauth-protected-resource/mcp`);

  const preflight = await fetch(`${mock.origin}/token`, { method: 'OPTIONS', headers: { origin: 'chrome-extension://abc', 'access-control-request-method': 'POST' } });
  assert.equal(preflight.status, 204);
  assert.equal(preflight.headers.get('access-control-allow-origin'), '*');
  assert.equal(preflight.headers.get('access-control-allow-methods'), 'GET, POST');
  assert.equal(preflight.headers.get('access-control-allow-headers'), 'content-type, authorization, mcp-protocol-version');

  assert.equal((await fetch(`${mock.origin}/token`)).status, 405, 'GET /token');
  assert.deepEqual(mock.authLog().map((e) => [e.kind, e.status]), [['metadata', 200], ['as-metadata', 200], ['token', 405]]);
});

test('registration_wants_good_redirect_uris_and_a_public_client', async (t) => {
  const mock = await startMockMcp({ auth: true });
  t.after(() => mock.close());

  for (const body of [
    {},
    { redirect_uris: [] },
    { redirect_uris: 'https://a.example/cb' },
    { redirect_uris: ['http://example.com/cb'] },
    { redirect_uris: ['http://localhost:8080/cb'] },
    { redirect_uris: ['https://a.example/cb#frag'] },
    { redirect_uris: ['javascript:alert(1)'] },
    { redirect_uris: ['not a url'] },
  ]) {
    await assertOAuthError(await register(mock, body), 400, 'invalid_redirect_uri');
  }
  await assertOAuthError(await register(mock, { redirect_uris: [REDIRECT], token_endpoint_auth_method: 'client_secret_basic' }), 400, 'invalid_client_metadata');
  await assertOAuthError(await register(mock, 'not json'), 400, 'invalid_client_metadata');
  assert.deepEqual(mock.clients(), []);

  const response = await register(mock, { redirect_uris: [REDIRECT, 'http://127.0.0.1:7777/cb'], client_name: 'Test Extension', token_endpoint_auth_method: 'none' });
  assert.equal(response.status, 201);
  assert.equal(response.headers.get('access-control-allow-origin'), '*');
  const registered = await response.json();
  assert.equal(registered.client_id, 'client-1');
  assert.equal(typeof registered.client_id_issued_at, 'number');
  assert.deepEqual({ ...registered, client_id_issued_at: 0 }, {
    client_id: 'client-1',
    client_id_issued_at: 0,
    redirect_uris: [REDIRECT, 'http://127.0.0.1:7777/cb'],
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'none',
    client_name: 'Test Extension',
  });
  assert.deepEqual(mock.clients(), [registered]);
  assert.equal((await client(mock)).client_id, 'client-2');

  const log = mock.authLog();
  assert.equal(log.length, 12);
  assert.deepEqual(log[0], { ...log[0], kind: 'register', status: 400, error: 'invalid_redirect_uri', params: {} });
  assert.deepEqual(log[10].params.redirect_uris, [REDIRECT, 'http://127.0.0.1:7777/cb']);
  assert.equal(log[10].clientId, 'client-1');
  assert.equal(log[10].status, 201);
});

test('sign_in_with_auto_approve_then_initialize_with_the_bearer_token', async (t) => {
  const mock = await startMockMcp({ auth: { autoApprove: true, accessTtlSeconds: 120 } });
  t.after(() => mock.close());
  const c = await client(mock);
  const { verifier, challenge } = pkce();

  const authorize = await get(authorizeUrl(mock, c.client_id, challenge));
  const query = redirected(authorize);
  assert.deepEqual(Object.keys(query), ['code', 'state']);
  assert.equal(query.state, 'st-123');

  const response = await exchange(mock, c.client_id, query.code, verifier);
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('cache-control'), 'no-store');
  assert.match(response.headers.get('content-type'), /^application\/json/);
  const tokens = await response.json();
  assert.deepEqual(Object.keys(tokens).sort(), ['access_token', 'expires_in', 'refresh_token', 'scope', 'token_type']);
  assert.equal(tokens.token_type, 'Bearer');
  assert.equal(tokens.expires_in, 120);
  assert.equal(tokens.scope, 'tools');

  const init = await post(mock, INITIALIZE, { token: tokens.access_token });
  assert.equal(init.status, 200);
  const session = init.headers.get('mcp-session-id');
  assert.ok(session);
  assert.equal((await post(mock, { jsonrpc: '2.0', method: 'notifications/initialized' }, { token: tokens.access_token, session })).status, 202);
  assert.equal((await post(mock, { jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} }, { token: tokens.access_token, session })).status, 200);
  // Every message needs the token, not only initialize.
  assertUnauthorized(mock, await post(mock, { jsonrpc: '2.0', id: 3, method: 'tools/list', params: {} }, { session }), false);

  const [issued] = mock.tokens();
  assert.equal(issued.accessToken, tokens.access_token);
  assert.equal(issued.refreshToken, tokens.refresh_token);
  assert.equal(issued.clientId, c.client_id);
  assert.equal(issued.resource, mock.url);
  assert.equal(issued.revoked, false);
  assert.equal(issued.expired, false);
  assert.ok(issued.expiresAt - issued.issuedAt === 120_000);

  const log = mock.authLog();
  assert.deepEqual(log.map((e) => [e.kind, e.status]), [['register', 201], ['authorize', 302], ['token', 200]]);
  assert.equal(log[1].params.code_challenge, challenge);
  assert.equal(log[1].params.resource, mock.url);
  assert.equal(log[1].approved, 'auto');
  assert.equal(log[1].location, authorize.headers.get('location'));
  assert.equal(log[2].params.code_verifier, verifier);
  assert.equal(log[2].params.grant_type, 'authorization_code');
  assert.deepEqual(log[2].issued, { accessToken: tokens.access_token, refreshToken: tokens.refresh_token });
  assert.equal(log[2].headers['content-type'], 'application/x-www-form-urlencoded');
});

test('sign_in_through_the_allow_page', async (t) => {
  const mock = await startMockMcp({ auth: true });
  t.after(() => mock.close());
  const c = await client(mock);
  const { verifier, challenge } = pkce();

  const page = await get(authorizeUrl(mock, c.client_id, challenge));
  assert.equal(page.status, 200);
  assert.match(page.headers.get('content-type'), /^text\/html/);
  const html = await page.text();
  assert.match(html, /<title>Sign in to mock-mcp<\/title>/);
  assert.match(html, /Test Extension/);
  assert.match(html, /<button id="allow"[^>]*>Allow<\/button>/);
  assert.match(html, /<button id="deny"[^>]*>Deny<\/button>/);
  const allowHref = /<button id="allow"[^>]*data-href="([^"]+)"/.exec(html)[1].replace(/&amp;/g, '&');
  const [entry] = mock.authLog().filter((e) => e.kind === 'authorize');
  assert.equal(allowHref, `/authorize/decide?request=${entry.request}&allow=1`);
  // The form submits the same URL.
  assert.match(html, new RegExp(`<form method="get" action="/authorize/decide"><input type="hidden" name="request" value="${entry.request}"><input type="hidden" name="allow" value="1"><button id="allow"`));

  const { code, state } = redirected(await get(new URL(allowHref, mock.origin)));
  assert.equal(state, 'st-123');
  const response = await exchange(mock, c.client_id, code, verifier);
  assert.equal(response.status, 200);
  const tokens = await response.json();
  assert.equal((await post(mock, INITIALIZE, { token: tokens.access_token })).status, 200);

  // Decided once only.
  assert.equal((await get(new URL(allowHref, mock.origin))).status, 400);
  const decides = mock.authLog().filter((e) => e.kind === 'decide');
  assert.deepEqual(decides.map((e) => [e.status, e.allow, e.request]), [[302, true, entry.request], [400, undefined, entry.request]]);

  // Switched at runtime: straight to the code.
  mock.setAutoApprove(true);
  assert.ok(redirected(await get(authorizeUrl(mock, c.client_id, pkce().challenge))).code);
});

test('deny_redirects_with_access_denied', async (t) => {
  const mock = await startMockMcp({ auth: true });
  t.after(() => mock.close());
  const c = await client(mock);
  const html = await (await get(authorizeUrl(mock, c.client_id, pkce().challenge, { state: 'deny-me' }))).text();
  const denyHref = /<button id="deny"[^>]*data-href="([^"]+)"/.exec(html)[1].replace(/&amp;/g, '&');
  assert.match(denyHref, /&allow=0$/);
  assert.deepEqual(redirected(await get(new URL(denyHref, mock.origin))), { error: 'access_denied', state: 'deny-me' });
  const decide = mock.authLog().at(-1);
  assert.equal(decide.kind, 'decide');
  assert.equal(decide.allow, false);
  assert.equal(decide.error, 'access_denied');
});

test('authorize_refuses_bad_requests', async (t) => {
  const mock = await startMockMcp({ auth: { autoApprove: true } });
  t.after(() => mock.close());
  const c = await client(mock);
  const { challenge } = pkce();

  // Never redirected: unknown client, unregistered redirect_uri.
  for (const url of [
    authorizeUrl(mock, 'client-99', challenge),
    authorizeUrl(mock, c.client_id, challenge, { redirect_uri: 'https://evil.example/cb' }),
    authorizeUrl(mock, c.client_id, challenge, { redirect_uri: undefined }),
  ]) {
    const response = await get(url);
    assert.equal(response.status, 400, url);
    assert.equal(response.headers.get('location'), null);
    assert.match(response.headers.get('content-type'), /^text\/html/);
  }
  // Redirected with invalid_request and the state.
  for (const overrides of [
    { resource: `${mock.origin}/other` },
    { resource: undefined },
    { code_challenge: undefined },
    { code_challenge_method: 'plain' },
    { code_challenge_method: undefined },
    { response_type: 'token' },
    { scope: 'tools root' },
  ]) {
    const query = redirected(await get(authorizeUrl(mock, c.client_id, challenge, overrides)));
    assert.equal(query.error, 'invalid_request', JSON.stringify(overrides));
    assert.equal(query.state, 'st-123');
    assert.ok(query.error_description);
    assert.equal(query.code, undefined);
  }
});

test('the_token_endpoint_checks_pkce_and_uses_a_code_once', async (t) => {
  const mock = await startMockMcp({ auth: { autoApprove: true } });
  t.after(() => mock.close());
  const c = await client(mock);
  const { verifier, challenge } = pkce();
  const { code } = redirected(await get(authorizeUrl(mock, c.client_id, challenge)));

  await assertOAuthError(await exchange(mock, c.client_id, code, pkce().verifier), 400, 'invalid_grant');
  await assertOAuthError(await exchange(mock, c.client_id, code, 'short'), 400, 'invalid_grant');
  await assertOAuthError(await exchange(mock, c.client_id, code, verifier, { redirect_uri: 'http://127.0.0.1:1/cb' }), 400, 'invalid_grant');
  await assertOAuthError(await exchange(mock, c.client_id, code, verifier, { resource: `${mock.origin}/other` }), 400, 'invalid_grant');
  await assertOAuthError(await exchange(mock, c.client_id, code, verifier, { resource: '' }), 400, 'invalid_request');
  await assertOAuthError(await exchange(mock, 'client-99', code, verifier), 400, 'invalid_client');
  const other = await client(mock);
  await assertOAuthError(await exchange(mock, other.client_id, code, verifier), 400, 'invalid_grant');
  await assertOAuthError(await exchange(mock, c.client_id, 'no-such-code', verifier), 400, 'invalid_grant');
  await assertOAuthError(await token(mock, { grant_type: 'password', client_id: c.client_id }), 400, 'unsupported_grant_type');
  await assertOAuthError(await token(mock, { client_id: c.client_id }), 400, 'invalid_request');
  const json = await fetch(`${mock.origin}/token`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ grant_type: 'authorization_code', code }) });
  await assertOAuthError(json, 400, 'invalid_request');
  const wrong = mock.authLog().filter((e) => e.kind === 'token')[0];
  assert.equal(wrong.status, 400);
  assert.equal(wrong.error, 'invalid_grant');

  // A failed check did not use the code up; the right verifier gets tokens once.
  const first = await exchange(mock, c.client_id, code, verifier);
  assert.equal(first.status, 200);
  const tokens = await first.json();
  assert.equal((await post(mock, INITIALIZE, { token: tokens.access_token })).status, 200);
  await assertOAuthError(await exchange(mock, c.client_id, code, verifier), 400, 'invalid_grant');
  // ...and the second use revoked what the first got.
  assertUnauthorized(mock, await post(mock, INITIALIZE, { token: tokens.access_token }), true);
  await assertOAuthError(await refresh(mock, c.client_id, tokens.refresh_token), 400, 'invalid_grant');
  assert.equal(mock.tokens()[0].revoked, true);
});

test('refresh_rotates_the_refresh_token', async (t) => {
  const mock = await startMockMcp({ auth: true });
  t.after(() => mock.close());
  const { client: c, tokens } = await signIn(mock);

  const response = await refresh(mock, c.client_id, tokens.refresh_token);
  assert.equal(response.status, 200);
  assert.equal(response.headers.get('cache-control'), 'no-store');
  const next = await response.json();
  assert.notEqual(next.access_token, tokens.access_token);
  assert.notEqual(next.refresh_token, tokens.refresh_token);
  assert.equal(next.token_type, 'Bearer');
  assert.equal(next.expires_in, 3600);
  assert.equal(next.scope, 'tools');
  assert.equal((await post(mock, INITIALIZE, { token: next.access_token })).status, 200);

  await assertOAuthError(await refresh(mock, c.client_id, tokens.refresh_token), 400, 'invalid_grant');
  const other = await client(mock);
  await assertOAuthError(await refresh(mock, other.client_id, next.refresh_token), 400, 'invalid_grant');
  const again = await token(mock, { grant_type: 'refresh_token', refresh_token: next.refresh_token, client_id: c.client_id });
  assert.equal(again.status, 200, 'resource may be left out');

  const refreshes = mock.authLog().filter((e) => e.kind === 'token' && e.params.grant_type === 'refresh_token');
  assert.equal(refreshes[0].params.refresh_token, tokens.refresh_token);
  assert.equal(refreshes[0].status, 200);
  assert.equal(refreshes[1].status, 400);
  assert.deepEqual(mock.tokens().map((x) => x.grantType), ['authorization_code', 'refresh_token', 'refresh_token']);
});

test('expired_access_tokens_get_invalid_token_and_refresh_still_works', async (t) => {
  const mock = await startMockMcp({ auth: true });
  t.after(() => mock.close());
  const { client: c, tokens } = await signIn(mock);
  const init = await post(mock, INITIALIZE, { token: tokens.access_token });
  assert.equal(init.status, 200);
  const session = init.headers.get('mcp-session-id');

  mock.expireAccessTokens();
  assert.equal(mock.tokens()[0].expired, true);
  const refused = await post(mock, { jsonrpc: '2.0', id: 2, method: 'ping' }, { token: tokens.access_token, session });
  assertUnauthorized(mock, refused, true);
  assert.equal(mock.log().at(-1).authError, 'invalid_token');
  assert.equal(mock.log().at(-1).method, 'ping');

  const response = await refresh(mock, c.client_id, tokens.refresh_token);
  assert.equal(response.status, 200);
  const next = await response.json();
  // The session survives the new token.
  assert.equal((await post(mock, { jsonrpc: '2.0', id: 3, method: 'ping' }, { token: next.access_token, session })).status, 200);
});

test('an_access_token_expires_by_its_ttl', async (t) => {
  const mock = await startMockMcp({ auth: { accessTtlSeconds: 0.2 } });
  t.after(() => mock.close());
  const { tokens } = await signIn(mock);
  assert.equal(tokens.expires_in, 0.2);
  assert.equal((await post(mock, INITIALIZE, { token: tokens.access_token })).status, 200);
  await new Promise((resolve) => setTimeout(resolve, 300));
  assertUnauthorized(mock, await post(mock, INITIALIZE, { token: tokens.access_token }), true);
});

test('revoked_grants_refuse_refresh_and_reset_forgets_auth', async (t) => {
  const mock = await startMockMcp({ auth: true });
  t.after(() => mock.close());
  const { client: c, tokens } = await signIn(mock);
  // An undecided code is revoked too.
  const { verifier, challenge } = pkce();
  const { code } = redirected(await get(authorizeUrl(mock, c.client_id, challenge)));

  mock.revokeGrants();
  assertUnauthorized(mock, await post(mock, INITIALIZE, { token: tokens.access_token }), true);
  await assertOAuthError(await refresh(mock, c.client_id, tokens.refresh_token), 400, 'invalid_grant');
  await assertOAuthError(await exchange(mock, c.client_id, code, verifier), 400, 'invalid_grant');
  assert.equal(mock.tokens()[0].revoked, true);

  // Signing in again works.
  const again = await signIn(mock);
  assert.equal((await post(mock, INITIALIZE, { token: again.tokens.access_token })).status, 200);

  mock.reset();
  assert.deepEqual(mock.clients(), []);
  assert.deepEqual(mock.tokens(), []);
  assert.deepEqual(mock.authLog(), []);
  assertUnauthorized(mock, await post(mock, INITIALIZE, { token: again.tokens.access_token }), true);
  // autoApprove back to the option's (false): the page again; client ids not reused.
  const fresh = await client(mock);
  assert.equal(fresh.client_id, 'client-3');
  assert.equal((await get(authorizeUrl(mock, fresh.client_id, pkce().challenge))).status, 200);
});

test('a_challenge_scope_is_named_in_every_401', async (t) => {
  const mock = await startMockMcp({ auth: { challengeScope: 'tools', scopes: ['tools', 'admin'] } });
  t.after(() => mock.close());
  const metadata = `${mock.origin}/.well-known/oauth-protected-resource/mcp`;

  const missing = await post(mock, INITIALIZE);
  assert.equal(missing.status, 401);
  assert.equal(missing.headers.get('www-authenticate'), `Bearer resource_metadata="${metadata}", scope="tools"`);
  const invalid = await post(mock, INITIALIZE, { token: 'forged' });
  assert.equal(invalid.headers.get('www-authenticate'), `Bearer resource_metadata="${metadata}", error="invalid_token", scope="tools"`);
  const streamed = await fetch(mock.url, { headers: { accept: 'text/event-stream' } });
  assert.equal(streamed.status, 401);
  assert.equal(streamed.headers.get('www-authenticate'), `Bearer resource_metadata="${metadata}", scope="tools"`);
  assert.equal(mock.auth.challengeScope, 'tools');
  // The metadata still lists every scope: the challenge only says which to ask for.
  assert.deepEqual((await (await fetch(metadata)).json()).scopes_supported, ['tools', 'admin']);
});

test('without_challenge_metadata_the_401_names_no_metadata_address', async (t) => {
  const plain = await startMockMcp({ auth: { challengeMetadata: false } });
  t.after(() => plain.close());
  assert.equal((await post(plain, INITIALIZE)).headers.get('www-authenticate'), 'Bearer realm="mock-mcp"');
  assert.equal((await post(plain, INITIALIZE, { token: 'forged' })).headers.get('www-authenticate'), 'Bearer error="invalid_token"');
  assert.deepEqual(plain.log().map((e) => [e.status, e.authError]), [[401, 'missing'], [401, 'invalid_token']]);
  // The metadata is still served where it was; only the challenge is silent about it.
  assert.equal((await fetch(plain.auth.resourceMetadataUrl)).status, 200);

  const scoped = await startMockMcp({ auth: { challengeMetadata: false, challengeScope: 'tools' } });
  t.after(() => scoped.close());
  assert.equal((await post(scoped, INITIALIZE)).headers.get('www-authenticate'), 'Bearer scope="tools"');
  assert.equal((await post(scoped, INITIALIZE, { token: 'forged' })).headers.get('www-authenticate'), 'Bearer error="invalid_token", scope="tools"');
});

test('the_resource_metadata_can_be_at_the_root_or_at_both_addresses', async (t) => {
  const atPath = '/.well-known/oauth-protected-resource/mcp';
  const atRoot = '/.well-known/oauth-protected-resource';

  const root = await startMockMcp({ auth: { metadataAt: 'root' } });
  t.after(() => root.close());
  assert.equal(root.auth.resourceMetadataUrl, `${root.origin}${atRoot}`);
  assert.equal(root.auth.metadataAt, 'root');
  assert.equal((await post(root, INITIALIZE)).headers.get('www-authenticate'), `Bearer resource_metadata="${root.origin}${atRoot}"`);
  const served = await fetch(`${root.origin}${atRoot}`);
  assert.equal(served.status, 200);
  assert.equal(served.headers.get('access-control-allow-origin'), '*');
  assert.deepEqual(await served.json(), { resource: root.origin, authorization_servers: [root.origin], scopes_supported: ['tools'], bearer_methods_supported: ['header'] });
  // The path-inserted address is unknown, like any other path.
  assert.equal((await fetch(`${root.origin}${atPath}`)).status, 404);
  assert.deepEqual(root.authLog().map((e) => [e.kind, e.path, e.status]), [['metadata', atRoot, 200]]);
  assert.deepEqual(root.log().at(-1), { ...root.log().at(-1), kind: 'rejected', status: 404 });

  const both = await startMockMcp({ auth: { metadataAt: 'both' } });
  t.after(() => both.close());
  assert.equal(both.auth.resourceMetadataUrl, `${both.origin}${atPath}`);
  assert.equal((await post(both, INITIALIZE)).headers.get('www-authenticate'), `Bearer resource_metadata="${both.origin}${atPath}"`);
  const documents = [];
  for (const path of [atPath, atRoot]) {
    const response = await fetch(`${both.origin}${path}`);
    assert.equal(response.status, 200, path);
    documents.push(await response.json());
  }
  // The root's describes the origin (RFC 9728 §3.3), the other the server.
  assert.deepEqual({ ...documents[0], resource: both.origin }, documents[1]);
  assert.equal(documents[0].resource, both.url);
  assert.deepEqual(both.authLog().map((e) => [e.kind, e.path, e.status]), [['metadata', atPath, 200], ['metadata', atRoot, 200]]);

  // The default serves the path-inserted address only.
  const byDefault = await startMockMcp({ auth: true });
  t.after(() => byDefault.close());
  assert.equal(byDefault.auth.metadataAt, 'path');
  assert.equal((await fetch(`${byDefault.origin}${atRoot}`)).status, 404);
  assert.equal((await fetch(`${byDefault.origin}${atPath}`)).status, 200);
});

test('bad_auth_options_fail_at_start_up', async () => {
  await assert.rejects(startMockMcp({ auth: { scopedTools: { create_ticket: 'admin' } } }), /auth\.scopedTools\.create_ticket needs "admin", which is not one of auth\.scopes \(tools\)/);
  await assert.rejects(startMockMcp({ auth: { metadataAt: 'nowhere' } }), /auth\.metadataAt/);
  await assert.rejects(startMockMcp({ auth: { challengeScope: ['tools'] } }), /auth\.challengeScope/);
  await assert.rejects(startMockMcp({ auth: { challengeMetadata: 'no' } }), /auth\.challengeMetadata/);
});

test('a_scoped_tool_is_refused_with_403_insufficient_scope_until_the_token_has_its_scope', async (t) => {
  const mock = await startMockMcp({ auth: { scopes: ['tools', 'admin'], scopedTools: { create_ticket: 'admin' } } });
  t.after(() => mock.close());
  // A sign-in asking only `tools` is granted only `tools`.
  const { tokens } = await signIn(mock, { scope: 'tools' });
  assert.equal(tokens.scope, 'tools');
  const session = await openSession(mock, tokens.access_token);

  const refused = await callTool(mock, tokens.access_token, session, 7, 'create_ticket', { subject: 'Refund' });
  assert.equal(refused.status, 403);
  assert.equal(refused.headers.get('www-authenticate'), `Bearer error="insufficient_scope", scope="tools admin", resource_metadata="${mock.auth.resourceMetadataUrl}"`);
  assert.deepEqual(await refused.json(), { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Forbidden: the access token lacks the scope admin.' } });
  const entry = mock.log().at(-1);
  assert.deepEqual(
    [entry.kind, entry.status, entry.authError, entry.method, entry.id, entry.params, entry.session],
    ['rejected', 403, 'insufficient_scope', 'tools/call', 7, { name: 'create_ticket', arguments: { subject: 'Refund' } }, session],
  );
  assert.deepEqual(mock.tickets(), [], 'the tool did not run');
  assert.deepEqual(mock.calls(), []);

  // Tools no scope is needed for still run with that token.
  const search = await callTool(mock, tokens.access_token, session, 8, 'search', { query: 'refund' });
  assert.equal(search.status, 200);
  assert.match(await search.text(), /2 passages for \\"refund\\"/);
  // A token that is not live is still a 401 first.
  assertUnauthorized(mock, await callTool(mock, 'forged', session, 9, 'create_ticket', { subject: 'Refund' }), true);

  // Signed in again for the scopes the refusal named: the call goes through.
  const more = await signIn(mock, { scope: 'tools admin' });
  assert.equal(more.tokens.scope, 'tools admin');
  const opened = await callTool(mock, more.tokens.access_token, session, 10, 'create_ticket', { subject: 'Refund' });
  assert.equal(opened.status, 200);
  assert.match(await opened.text(), /Opened ticket T-1: Refund/);
  assert.deepEqual(mock.tickets(), ['Refund']);
  assert.deepEqual(mock.calls().map((e) => e.tool), ['search', 'create_ticket']);
});

test('an_insufficient_scope_challenge_follows_the_metadata_options', async (t) => {
  const silent = await startMockMcp({ auth: { scopes: ['tools', 'admin', 'files'], scopedTools: { create_ticket: 'admin' }, challengeMetadata: false } });
  t.after(() => silent.close());
  const { tokens } = await signIn(silent, { scope: 'files tools' });
  const session = await openSession(silent, tokens.access_token);
  const refused = await callTool(silent, tokens.access_token, session, 2, 'create_ticket', { subject: 'x' });
  assert.equal(refused.status, 403);
  // The token's scopes in their order, then the needed one; no metadata address.
  assert.equal(refused.headers.get('www-authenticate'), 'Bearer error="insufficient_scope", scope="files tools admin"');

  const root = await startMockMcp({ auth: { scopes: ['tools', 'admin'], scopedTools: { create_ticket: 'admin' }, metadataAt: 'root' } });
  t.after(() => root.close());
  const signedIn = await signIn(root, { scope: 'tools' });
  const rootSession = await openSession(root, signedIn.tokens.access_token);
  const named = await callTool(root, signedIn.tokens.access_token, rootSession, 2, 'create_ticket', { subject: 'x' });
  assert.equal(named.headers.get('www-authenticate'), `Bearer error="insufficient_scope", scope="tools admin", resource_metadata="${root.origin}/.well-known/oauth-protected-resource"`);
});

test('iss_parameter_names_the_issuer_in_every_redirect_back', async (t) => {
  const mock = await startMockMcp({ auth: { issParameter: true } });
  t.after(() => mock.close());
  const as = await (await fetch(`${mock.origin}/.well-known/oauth-authorization-server`)).json();
  assert.equal(as.authorization_response_iss_parameter_supported, true);
  assert.equal(mock.auth.issParameter, true);
  const c = await client(mock);

  // The Allow page's decision, with a code or access_denied.
  const pageHref = async (button) => {
    const html = await (await get(authorizeUrl(mock, c.client_id, pkce().challenge))).text();
    return new URL(new RegExp(`<button id="${button}"[^>]*data-href="([^"]+)"`).exec(html)[1].replace(/&amp;/g, '&'), mock.origin);
  };
  const allowed = redirected(await get(await pageHref('allow')));
  assert.deepEqual(Object.keys(allowed), ['code', 'state', 'iss']);
  assert.equal(allowed.iss, mock.origin);
  assert.deepEqual(redirected(await get(await pageHref('deny'))), { error: 'access_denied', state: 'st-123', iss: mock.origin });

  // /authorize's own redirects: a code, an invalid_request.
  mock.setAutoApprove(true);
  const coded = await get(authorizeUrl(mock, c.client_id, pkce().challenge));
  assert.equal(redirected(coded).iss, mock.origin);
  assert.equal(mock.authLog().at(-1).location, coded.headers.get('location'));
  const bad = redirected(await get(authorizeUrl(mock, c.client_id, pkce().challenge, { code_challenge_method: 'plain' })));
  assert.equal(bad.error, 'invalid_request');
  assert.equal(bad.iss, mock.origin);

  // Another issuer (a mix-up), none, and back to the issuer after reset().
  mock.setRedirectIss('https://evil.example');
  assert.equal(redirected(await get(authorizeUrl(mock, c.client_id, pkce().challenge))).iss, 'https://evil.example');
  mock.setRedirectIss(null);
  assert.deepEqual(Object.keys(redirected(await get(authorizeUrl(mock, c.client_id, pkce().challenge)))), ['code', 'state']);
  mock.setRedirectIss(undefined);
  assert.equal(redirected(await get(authorizeUrl(mock, c.client_id, pkce().challenge))).iss, mock.origin);
  mock.setRedirectIss('https://evil.example');
  mock.reset();
  const again = await client(mock);
  mock.setAutoApprove(true);
  assert.equal(redirected(await get(authorizeUrl(mock, again.client_id, pkce().challenge))).iss, mock.origin);
  assert.throws(() => mock.setRedirectIss(42), TypeError);
});

test('without_iss_parameter_redirects_carry_no_iss_unless_one_is_set', async (t) => {
  const mock = await startMockMcp({ auth: { autoApprove: true } });
  t.after(() => mock.close());
  const as = await (await fetch(`${mock.origin}/.well-known/oauth-authorization-server`)).json();
  assert.equal('authorization_response_iss_parameter_supported' in as, false);
  const c = await client(mock);
  assert.deepEqual(Object.keys(redirected(await get(authorizeUrl(mock, c.client_id, pkce().challenge)))), ['code', 'state']);
  // A server that sends iss without advertising it.
  mock.setRedirectIss('https://evil.example');
  assert.equal(redirected(await get(authorizeUrl(mock, c.client_id, pkce().challenge))).iss, 'https://evil.example');
});

test('a_token_delay_holds_token_requests_which_are_counted_on_arrival', async (t) => {
  const mock = await startMockMcp({ auth: true });
  t.after(() => mock.close());
  assert.equal(mock.tokenRequestsReceived(), 0);
  const { client: c, tokens } = await signIn(mock);
  assert.equal(mock.tokenRequestsReceived(), 1);

  mock.setTokenDelay(400);
  const started = Date.now();
  const renewal = refresh(mock, c.client_id, tokens.refresh_token);
  // waitFor sees the arrival while the request is still held: not handled yet.
  await mock.waitFor(() => mock.tokenRequestsReceived() === 2, { timeout: 5000, message: 'a renewal in flight' });
  assert.equal(mock.authLog().filter((e) => e.kind === 'token').length, 1);
  assert.equal(mock.tokens().length, 1);
  const response = await renewal;
  assert.ok(Date.now() - started >= 350, `held ${Date.now() - started} ms`);
  assert.equal(response.status, 200);
  assert.equal(mock.authLog().filter((e) => e.kind === 'token').at(-1).status, 200);
  assert.equal(mock.tokens().length, 2);

  // Preflights and other methods are not token requests.
  await fetch(`${mock.origin}/token`, { method: 'OPTIONS' });
  await fetch(`${mock.origin}/token`);
  assert.equal(mock.tokenRequestsReceived(), 2);
  // Refused requests count too.
  await assertOAuthError(await refresh(mock, c.client_id, 'no-such-token'), 400, 'invalid_grant');
  assert.equal(mock.tokenRequestsReceived(), 3);

  mock.reset();
  assert.equal(mock.tokenRequestsReceived(), 0);
  const quick = Date.now();
  await assertOAuthError(await refresh(mock, c.client_id, tokens.refresh_token), 400, 'invalid_client');
  assert.ok(Date.now() - quick < 350, 'reset() sets the delay back to 0');
  assert.equal(mock.tokenRequestsReceived(), 1);
  assert.throws(() => mock.setTokenDelay(-1), TypeError);
});

test('close_drops_a_held_token_request', async () => {
  const mock = await startMockMcp({ auth: true });
  mock.setTokenDelay(60_000);
  const held = refresh(mock, 'client-1', 'rt-x').then(() => 'answered', () => 'dropped');
  await mock.waitFor(() => mock.tokenRequestsReceived() === 1, { timeout: 5000 });
  const started = Date.now();
  await mock.close();
  assert.equal(await held, 'dropped');
  assert.ok(Date.now() - started < 5000);
});

test('waitFor_sees_auth_log_entries', async (t) => {
  const mock = await startMockMcp({ auth: true });
  t.after(() => mock.close());
  const waiting = mock.waitFor(() => mock.authLog().some((e) => e.kind === 'register'), { timeout: 5000 });
  await client(mock);
  await waiting;
});

test('the_cli_serves_auth_with_the_auth_flag', async (t) => {
  const child = spawn(process.execPath, [fileURLToPath(new URL('./server.mjs', import.meta.url)), '--auth'], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.after(() => child.kill('SIGTERM'));
  const url = await new Promise((resolve, rejectLine) => {
    let out = '';
    child.stdout.on('data', (chunk) => {
      out += chunk;
      const line = out.split('\n')[0];
      if (out.includes('\n')) resolve(line.replace(/^MOCK_MCP_URL=/, ''));
    });
    child.once('exit', (code) => rejectLine(new Error(`exited ${code}`)));
  });
  assert.match(url, /^http:\/\/127\.0\.0\.1:\d+\/mcp$/);
  const response = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT }, body: JSON.stringify(INITIALIZE) });
  assert.equal(response.status, 401);
  const metadata = await (await fetch(new URL('/.well-known/oauth-protected-resource/mcp', url))).json();
  assert.equal(metadata.resource, url);
});

/** A 400 page's reason (`<p id="error">`), unescaped; the response must be that page, not a redirect. */
async function refusalText(response) {
  assert.equal(response.status, 400);
  assert.equal(response.headers.get('location'), null);
  assert.match(response.headers.get('content-type'), /^text\/html/);
  const html = await response.text();
  const escaped = /<p id="error">([^<]*)<\/p>/.exec(html)?.[1];
  assert.ok(escaped, html);
  return escaped.replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
}

/** The Allow page's `allow` link, followed: the redirect's query. */
async function allowOnPage(mock, page) {
  assert.equal(page.status, 200);
  const html = await page.text();
  const href = /<button id="allow"[^>]*data-href="([^"]+)"/.exec(html)[1].replace(/&amp;/g, '&');
  return { html, query: redirected(await get(new URL(href, mock.origin))) };
}

const asMetadata = async (mock) => (await fetch(mock.auth.authorizationServerMetadataUrl)).json();

/** A good Client ID Metadata Document for the mock's own address. */
const metadataDocument = (mock, extra = {}) => ({
  client_id: mock.auth.clientMetadataUrl,
  client_name: 'SW Agent',
  redirect_uris: [REDIRECT],
  grant_types: ['authorization_code', 'refresh_token'],
  response_types: ['code'],
  token_endpoint_auth_method: 'none',
  ...extra,
});

test('without_registration_the_metadata_names_no_registration_endpoint_and_register_is_404', async (t) => {
  const mock = await startMockMcp({ auth: { registration: false } });
  t.after(() => mock.close());
  assert.equal(mock.auth.registration, false);
  assert.equal(mock.auth.registrationEndpoint, null);
  const as = await asMetadata(mock);
  assert.equal('registration_endpoint' in as, false);
  assert.equal('client_id_metadata_document_supported' in as, false);
  assert.equal(as.token_endpoint, `${mock.origin}/token`);

  const refused = await register(mock);
  assert.equal(refused.headers.get('access-control-allow-origin'), '*');
  await assertOAuthError(refused, 404, 'invalid_request');
  assert.equal((await fetch(`${mock.origin}/register`)).status, 404, 'GET /register');
  assert.deepEqual(mock.clients(), []);
  const log = mock.authLog();
  assert.deepEqual(log.map((e) => [e.kind, e.method, e.status]), [['as-metadata', 'GET', 200], ['register', 'POST', 404], ['register', 'GET', 404]]);
  assert.deepEqual(log[1].params, { redirect_uris: [REDIRECT], client_name: 'Test Extension' });
  assert.equal(log[1].error, 'invalid_request');
  assert.equal(log[1].clientId, undefined);

  // The default still offers registration.
  const open = await startMockMcp({ auth: true });
  t.after(() => open.close());
  assert.equal(open.auth.registration, true);
  assert.equal((await asMetadata(open)).registration_endpoint, `${open.origin}/register`);
  assert.equal(open.auth.registrationEndpoint, `${open.origin}/register`);
});

test('a_pre_registered_client_signs_in_refreshes_and_is_still_known_after_reset', async (t) => {
  const clients = [
    { client_id: 'sw-agent', redirect_uris: [REDIRECT], client_name: 'SW Agent' },
    { client_id: 'other-app', redirect_uris: ['http://127.0.0.1:7777/cb'] },
  ];
  const mock = await startMockMcp({ auth: { registration: false, clients } });
  t.after(() => mock.close());
  assert.deepEqual(mock.auth.clients, clients);
  // Not registration answers.
  assert.deepEqual(mock.clients(), []);

  const { verifier, challenge } = pkce();
  const { html, query } = await allowOnPage(mock, await get(authorizeUrl(mock, 'sw-agent', challenge)));
  assert.match(html, /<strong id="client-name">SW Agent<\/strong>/);
  assert.equal(query.state, 'st-123');
  const response = await exchange(mock, 'sw-agent', query.code, verifier);
  assert.equal(response.status, 200);
  const tokens = await response.json();
  assert.equal((await post(mock, INITIALIZE, { token: tokens.access_token })).status, 200);
  const renewed = await refresh(mock, 'sw-agent', tokens.refresh_token);
  assert.equal(renewed.status, 200);
  assert.deepEqual(mock.tokens().map((x) => [x.clientId, x.grantType]), [['sw-agent', 'authorization_code'], ['sw-agent', 'refresh_token']]);

  // The name falls back to the client_id.
  assert.match(await (await get(authorizeUrl(mock, 'other-app', challenge, { redirect_uri: 'http://127.0.0.1:7777/cb' }))).text(), /<strong id="client-name">other-app<\/strong>/);
  // Exact redirect_uri match, never redirected; another client's redirect is not this one's.
  for (const redirect of ['https://evil.example/cb', `${REDIRECT}/`, 'http://127.0.0.1:7777/cb']) {
    assert.equal(await refusalText(await get(authorizeUrl(mock, 'sw-agent', challenge, { redirect_uri: redirect }))), `redirect_uri ${redirect} is not registered for sw-agent.`);
  }
  assert.equal(await refusalText(await get(authorizeUrl(mock, 'sw-agent-2', challenge))), 'Unknown client_id: sw-agent-2.');
  // A code of one pre-registered client is not the other's.
  mock.setAutoApprove(true);
  const pair = pkce();
  const { code } = redirected(await get(authorizeUrl(mock, 'sw-agent', pair.challenge)));
  await assertOAuthError(await exchange(mock, 'other-app', code, pair.verifier), 400, 'invalid_grant');

  mock.reset();
  assert.deepEqual(mock.auth.clients, clients);
  await assertOAuthError(await refresh(mock, 'sw-agent', renewed.refresh_token), 400, 'invalid_grant');
  const again = pkce();
  const { query: after } = await allowOnPage(mock, await get(authorizeUrl(mock, 'sw-agent', again.challenge)));
  const signedIn = await exchange(mock, 'sw-agent', after.code, again.verifier);
  assert.equal(signedIn.status, 200);
  assert.equal((await refresh(mock, 'sw-agent', (await signedIn.json()).refresh_token)).status, 200);
  // autoApprove back to the option's: the page again.
  assert.deepEqual(mock.authLog().map((e) => [e.kind, e.status]), [['token', 400], ['authorize', 200], ['decide', 302], ['token', 200], ['token', 200]]);
});

test('client_metadata_documents_sign_in_end_to_end_with_one_fetch', async (t) => {
  const mock = await startMockMcp({ auth: { registration: false, clientMetadataDocuments: true } });
  t.after(() => mock.close());
  const url = `${mock.origin}/client-metadata.json`;
  assert.equal(mock.auth.clientMetadataUrl, url);
  assert.equal(mock.auth.clientMetadataDocuments, true);
  const as = await asMetadata(mock);
  assert.equal(as.client_id_metadata_document_supported, true);
  assert.equal('registration_endpoint' in as, false);

  // The mock serves the document itself: 404 until set.
  assert.equal((await fetch(url)).status, 404);
  const doc = metadataDocument(mock);
  mock.setClientMetadata(doc);
  const served = await fetch(url);
  assert.equal(served.status, 200);
  assert.match(served.headers.get('content-type'), /^application\/json/);
  assert.equal(served.headers.get('access-control-allow-origin'), '*');
  assert.deepEqual(await served.json(), doc);
  assert.equal(mock.clientMetadataFetches(), 0, 'a GET of the document is not a fetch by the authorization server');

  const { verifier, challenge } = pkce();
  const { html, query } = await allowOnPage(mock, await get(authorizeUrl(mock, url, challenge)));
  assert.match(html, /<strong id="client-name">SW Agent<\/strong>/);
  assert.equal(mock.clientMetadataFetches(), 1);
  // The document is fetched, not changed behind the mock's back: later edits do not matter to /token.
  mock.setClientMetadata(null);
  const response = await exchange(mock, url, query.code, verifier);
  assert.equal(response.status, 200);
  const tokens = await response.json();
  assert.equal((await post(mock, INITIALIZE, { token: tokens.access_token })).status, 200);
  const renewed = await refresh(mock, url, tokens.refresh_token);
  assert.equal(renewed.status, 200);
  assert.equal((await refresh(mock, url, (await renewed.json()).refresh_token)).status, 200);
  assert.equal(mock.clientMetadataFetches(), 1, '/token fetches nothing');
  assert.deepEqual(mock.tokens().map((x) => [x.clientId, x.grantType]), [[url, 'authorization_code'], [url, 'refresh_token'], [url, 'refresh_token']]);

  const log = mock.authLog();
  assert.deepEqual(log.map((e) => [e.kind, e.status]), [
    ['as-metadata', 200], ['client-metadata', 200], ['authorize', 200], ['decide', 302], ['token', 200], ['token', 200], ['token', 200],
  ]);
  assert.deepEqual(log[1], { kind: 'client-metadata', url, status: 200, ok: true });
  assert.equal(log[2].params.client_id, url);

  // Every authorization request fetches again; reset() forgets the document served and the count.
  mock.setClientMetadata(doc);
  mock.setAutoApprove(true);
  assert.ok(redirected(await get(authorizeUrl(mock, url, pkce().challenge))).code);
  assert.equal(mock.clientMetadataFetches(), 2);
  mock.reset();
  assert.equal(mock.clientMetadataFetches(), 0);
  assert.equal((await fetch(url)).status, 404);
  await assertOAuthError(await refresh(mock, url, tokens.refresh_token), 400, 'invalid_client');
  assert.throws(() => mock.setClientMetadata('{}'), TypeError);
  assert.throws(() => mock.setClientMetadata([doc]), TypeError);
});

test('client_metadata_documents_are_refused_with_a_reason', async (t) => {
  const preRegisteredUrl = 'https://app.example/client.json';
  const mock = await startMockMcp({ auth: { autoApprove: true, clientMetadataDocuments: true, clients: [{ client_id: preRegisteredUrl, redirect_uris: [REDIRECT] }] } });
  t.after(() => mock.close());
  const url = mock.auth.clientMetadataUrl;
  const { challenge } = pkce();

  /** Serves `doc`, asks to authorize with `clientId`: the reason the page and the fetch's entry give, one fetch made. */
  const refusedFor = async (doc, status, clientId = url) => {
    const before = mock.clientMetadataFetches();
    mock.setClientMetadata(doc);
    const text = await refusalText(await get(authorizeUrl(mock, clientId, challenge)));
    assert.equal(mock.clientMetadataFetches(), before + 1);
    const [fetched, authorize] = mock.authLog().slice(-2);
    assert.deepEqual(Object.keys(fetched).sort(), ['kind', 'ok', 'reason', 'status', 'url']);
    assert.deepEqual([fetched.kind, fetched.url, fetched.status, fetched.ok], ['client-metadata', clientId, status, false]);
    assert.equal(text, `The Client ID Metadata Document at ${clientId} is refused: ${fetched.reason}.`);
    assert.deepEqual([authorize.kind, authorize.status, authorize.error, authorize.errorDescription], ['authorize', 400, 'invalid_request', text]);
    return fetched.reason;
  };

  assert.equal(await refusedFor(metadataDocument(mock, { client_id: 'https://other.example/client.json' }), 200), 'its client_id is "https://other.example/client.json", not the document\'s URL');
  assert.equal(await refusedFor(metadataDocument(mock, { client_id: `${url}?v=2` }), 200), `its client_id is "${url}?v=2", not the document's URL`);
  assert.equal(await refusedFor(metadataDocument(mock, { redirect_uris: ['https://evil.example/cb', `${REDIRECT}/`] }), 200), `its redirect_uris do not include ${REDIRECT}`);
  assert.equal(await refusedFor(metadataDocument(mock, { redirect_uris: REDIRECT }), 200), `redirect_uris is not an array: "${REDIRECT}"`);
  assert.equal(await refusedFor(null, 404), 'HTTP 404, not 200');
  assert.equal(await refusedFor(metadataDocument(mock, { token_endpoint_auth_method: 'private_key_jwt' }), 200), 'token_endpoint_auth_method must be "none" (a public client), not "private_key_jwt"');
  // A document at another address of the mock: an MCP path's JSON-RPC 404, not a client's.
  assert.equal(await refusedFor(metadataDocument(mock), 404, `${mock.origin}/elsewhere.json`), 'HTTP 404, not 200');
  // Nothing listening there.
  const closed = await startMockMcp();
  const gone = `${closed.origin}/client.json`;
  await closed.close();
  assert.match(await refusedFor(metadataDocument(mock), 0, gone), /^the fetch failed \(.+\)$/);

  // A refused document is not remembered: /token does not know its URL.
  mock.setClientMetadata(metadataDocument(mock, { token_endpoint_auth_method: 'client_secret_basic' }));
  await refusalText(await get(authorizeUrl(mock, url, challenge)));
  await assertOAuthError(await refresh(mock, url, 'rt-x'), 400, 'invalid_client');

  // Not fetched at all: not on 127.0.0.1 (the mock never reaches the network), no path, a fragment.
  const fetches = mock.clientMetadataFetches();
  const entries = mock.authLog().length;
  assert.equal(await refusalText(await get(authorizeUrl(mock, 'https://example.com/client.json', challenge))), 'client_id https://example.com/client.json cannot be a Client ID Metadata Document URL: the mock fetches documents on 127.0.0.1 only (it must not reach the network).');
  assert.match(await refusalText(await get(authorizeUrl(mock, 'http://example.com/client.json', challenge))), /it must be an https URL \(http only on 127\.0\.0\.1\)\.$/);
  assert.match(await refusalText(await get(authorizeUrl(mock, `${mock.origin}/`, challenge))), /it has no path\.$/);
  assert.match(await refusalText(await get(authorizeUrl(mock, `${url}#x`, challenge))), /it has a fragment\.$/);
  assert.equal(mock.clientMetadataFetches(), fetches);
  assert.deepEqual(mock.authLog().slice(entries).map((e) => [e.kind, e.status]), [['authorize', 400], ['authorize', 400], ['authorize', 400], ['authorize', 400]]);

  // A URL that is a pre-registered client's is that client: nothing fetched.
  assert.ok(redirected(await get(authorizeUrl(mock, preRegisteredUrl, challenge))).code);
  assert.equal(mock.clientMetadataFetches(), fetches);
  // And a good document after all those: signed in.
  mock.setClientMetadata(metadataDocument(mock));
  const pair = pkce();
  const { code } = redirected(await get(authorizeUrl(mock, url, pair.challenge)));
  assert.equal((await exchange(mock, url, code, pair.verifier)).status, 200);
  assert.equal(mock.authLog().filter((e) => e.kind === 'client-metadata').at(-1).ok, true);
});

test('a_url_client_id_is_an_unknown_client_without_client_metadata_documents', async (t) => {
  const mock = await startMockMcp({ auth: { autoApprove: true } });
  t.after(() => mock.close());
  assert.equal(mock.auth.clientMetadataDocuments, false);
  assert.equal('client_id_metadata_document_supported' in await asMetadata(mock), false);
  const url = mock.auth.clientMetadataUrl;
  mock.setClientMetadata(metadataDocument(mock));
  // Served all the same (a test may check what the client would do).
  assert.equal((await fetch(url)).status, 200);

  const pair = pkce();
  assert.equal(await refusalText(await get(authorizeUrl(mock, url, pair.challenge))), `Unknown client_id: ${url}.`);
  assert.equal(mock.clientMetadataFetches(), 0);
  assert.deepEqual(mock.authLog().map((e) => [e.kind, e.status]), [['as-metadata', 200], ['authorize', 400]]);
  await assertOAuthError(await refresh(mock, url, 'rt-x'), 400, 'invalid_client');

  // Without auth the document is not served.
  const plain = await startMockMcp();
  t.after(() => plain.close());
  assert.equal((await fetch(`${plain.origin}/client-metadata.json`)).status, 404);
});

test('bad_client_options_fail_at_start_up', async () => {
  const good = { client_id: 'sw-agent', redirect_uris: [REDIRECT] };
  await assert.rejects(startMockMcp({ auth: { registration: 'no' } }), /auth\.registration must be true or false, not "no"/);
  await assert.rejects(startMockMcp({ auth: { clientMetadataDocuments: 1 } }), /auth\.clientMetadataDocuments must be true or false, not 1/);
  await assert.rejects(startMockMcp({ auth: { clients: good } }), /auth\.clients must be an array/);
  for (const [clients, message] of [
    [['sw-agent'], /auth\.clients\[0\] must be an object/],
    [[{ redirect_uris: [REDIRECT] }], /auth\.clients\[0\] needs a client_id/],
    [[{ ...good, client_id: '' }], /auth\.clients\[0\] needs a client_id/],
    [[good, { ...good, client_id: 'client-1' }], /auth\.clients\[1\] client_id "client-1" has the form \/register gives out/],
    [[good, good], /auth\.clients\[1\] client_id "sw-agent" is given twice/],
    [[{ client_id: 'sw-agent' }], /auth\.clients\[0\] redirect_uris must be a non-empty array/],
    [[{ ...good, redirect_uris: [] }], /auth\.clients\[0\] redirect_uris must be a non-empty array/],
    [[{ ...good, redirect_uris: ['http://example.com/cb'] }], /auth\.clients\[0\] redirect_uris: "http:\/\/example\.com\/cb" must be an https URL or an http:\/\/127\.0\.0\.1 URL/],
    [[{ ...good, redirect_uri: REDIRECT }], /auth\.clients\[0\] has redirect_uri, which is not one of client_id, redirect_uris, client_name/],
    [[{ ...good, client_name: 7 }], /auth\.clients\[0\] client_name must be a string/],
  ]) {
    await assert.rejects(startMockMcp({ auth: { clients } }), message, JSON.stringify(clients));
  }
});

test('add_client_pre_registers_a_client_after_start_checked_like_the_option_and_kept_across_reset', async (t) => {
  const mock = await startMockMcp({ auth: { registration: false } });
  t.after(() => mock.close());
  const { challenge } = pkce();
  assert.equal(await refusalText(await get(authorizeUrl(mock, 'late-app', challenge))), 'Unknown client_id: late-app.');
  mock.addClient({ client_id: 'late-app', redirect_uris: [REDIRECT] });
  assert.throws(() => mock.addClient({ client_id: 'late-app', redirect_uris: [REDIRECT] }), /given twice/);
  assert.throws(() => mock.addClient({ client_id: 'client-3', redirect_uris: [REDIRECT] }), /the form \/register gives out/);
  assert.throws(() => mock.addClient({ client_id: 'x', redirect_uris: [] }), /non-empty array/);
  mock.reset();
  const { query } = await allowOnPage(mock, await get(authorizeUrl(mock, 'late-app', challenge)));
  assert.equal(query.state, 'st-123');
  assert.deepEqual(mock.clients(), [], 'not a registration answer');
});
