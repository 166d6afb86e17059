// Unit tests of extension/wasm-cache.js against an in-memory Cache Storage
// (no browser needed; the cold-start e2e test covers the real one).
// Run: node --test tests/extension/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { WASM_CACHE, buildId, cacheKey, cachedModule, forgetModules, instantiateModule, rememberModule } from '../../extension/wasm-cache.js';

/** Cache Storage as the spec describes it, kept in memory. */
function memoryCaches({ failOpen = false } = {}) {
  const caches = new Map();
  const urlOf = (request) => (typeof request === 'string' ? request : request.url);
  const storage = {
    async open(name) {
      if (failOpen) throw new Error('QuotaExceededError');
      if (!caches.has(name)) caches.set(name, new Map());
      const entries = caches.get(name);
      return {
        async match(request) {
          const hit = entries.get(urlOf(request));
          return hit ? hit.clone() : undefined;
        },
        async put(request, response) {
          entries.set(urlOf(request), response.clone());
        },
        async keys() {
          return [...entries.keys()].map((url) => new Request(url));
        },
        async delete(request) {
          return entries.delete(urlOf(request));
        },
      };
    },
    // CacheStorage.match with a cacheName looks in that cache only and
    // resolves to undefined when no cache of that name exists.
    async match(request, { cacheName } = {}) {
      if (failOpen) throw new Error('QuotaExceededError');
      const names = cacheName === undefined ? [...caches.keys()] : [cacheName];
      for (const name of names) {
        const hit = caches.get(name)?.get(urlOf(request));
        if (hit) return hit.clone();
      }
      return undefined;
    },
    async delete(name) {
      return caches.delete(name);
    },
    entries: (name) => caches.get(name) ?? new Map(),
    has: (name) => caches.has(name),
  };
  return storage;
}

const MODULE = new Uint8Array([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0]);
const MODULE_URL = 'chrome-extension://abc/pkg/sw_agent_bg.wasm';
const fetchModule = async (url) => {
  assert.equal(url, MODULE_URL);
  return new Response(MODULE, { headers: { 'Content-Type': 'application/wasm' } });
};

/** A stand-in for wasm-bindgen's init (given a Response) that records what it was given. */
function recordingInit() {
  const calls = [];
  const init = async ({ module_or_path: source }) => {
    const body = source instanceof Response ? new Uint8Array(await source.arrayBuffer()) : null;
    calls.push({ source, body, type: source instanceof Response ? source.headers.get('Content-Type') : null });
    // Like WebAssembly.instantiateStreaming: anything without the wasm magic fails.
    if (!body || body.length < 4 || body[0] !== 0 || body[1] !== 0x61 || body[2] !== 0x73 || body[3] !== 0x6d) {
      throw new WebAssembly.CompileError('not a wasm module');
    }
  };
  return { init, calls };
}

test('the build id is read from the version_name build.sh writes, and only from there', () => {
  assert.equal(buildId({ version: '0.1.0', version_name: '0.1.0 (wasm 5078f3740c89193f)' }), '5078f3740c89193f');
  assert.equal(buildId({ version: '0.1.0' }), null);
  assert.equal(buildId({ version_name: '0.1.0 (wasm nothex)' }), null);
  assert.equal(buildId(undefined), null);
  assert.match(cacheKey('5078f3740c89193f'), /^https:\/\/[^/]+\.invalid\/.*5078f3740c89193f/);
});

/** fetch of the packaged module, counting the requests. */
function countingFetch(response = () => new Response(MODULE, { headers: { 'Content-Type': 'application/wasm' } })) {
  const requests = [];
  const fetchFn = async (url) => {
    requests.push(url);
    return response();
  };
  return { fetchFn, requests };
}

test('a first start streams the packaged module, then the module is cached under its build from the same fetch and older builds are deleted', async () => {
  const storage = memoryCaches();
  await (await storage.open(WASM_CACHE)).put(cacheKey('0000000000000000'), new Response('old build'));
  const { init, calls } = recordingInit();
  const { fetchFn, requests } = countingFetch();
  const first = await instantiateModule(init, MODULE_URL, '1111111111111111', { storage, fetchFn });
  assert.equal(first.from, 'package');
  assert.equal(calls.length, 1);
  assert.deepEqual(calls[0].body, MODULE, 'the packaged module was compiled');
  assert.ok(first.copy instanceof Response, 'a copy is kept for the cache');

  assert.equal(await rememberModule('1111111111111111', first.copy, { storage }), true);
  assert.deepEqual(requests, [MODULE_URL], 'the package is fetched once: the cache takes the copy');
  assert.deepEqual([...storage.entries(WASM_CACHE).keys()], [cacheKey('1111111111111111')]);

  const next = recordingInit();
  const again = await instantiateModule(next.init, MODULE_URL, '1111111111111111', { storage, fetchFn });
  assert.deepEqual(again, { from: 'cache', copy: null });
  assert.deepEqual(requests, [MODULE_URL], 'a cached start does not fetch the package');
  assert.equal(next.calls.length, 1);
  assert.deepEqual(next.calls[0].body, MODULE);
  assert.equal(next.calls[0].type, 'application/wasm', 'instantiateStreaming needs the wasm content type');
});

test('a cached module that does not instantiate is forgotten and the packaged one is used', async () => {
  const storage = memoryCaches();
  await (await storage.open(WASM_CACHE)).put(cacheKey('2222222222222222'), new Response('not wasm', { headers: { 'Content-Type': 'application/wasm' } }));
  const { init, calls } = recordingInit();
  const warnings = [];
  const warn = console.warn;
  console.warn = (...args) => warnings.push(args);
  try {
    const { fetchFn } = countingFetch();
    assert.equal((await instantiateModule(init, MODULE_URL, '2222222222222222', { storage, fetchFn })).from, 'package');
  } finally {
    console.warn = warn;
  }
  assert.equal(calls.length, 2);
  assert.ok(calls[0].source instanceof Response);
  assert.deepEqual(calls[1].body, MODULE);
  assert.equal(warnings.length, 1);
  assert.equal(await cachedModule('2222222222222222', storage), null, 'the damaged entry is gone');
});

test('without a build id or a working Cache Storage the package is used and nothing is cached', async () => {
  const storage = memoryCaches();
  const { init, calls } = recordingInit();
  const { fetchFn } = countingFetch();
  assert.deepEqual(await instantiateModule(init, MODULE_URL, null, { storage, fetchFn }), { from: 'package', copy: null }, 'no build id: nothing to cache');
  const unsaved = await instantiateModule(init, MODULE_URL, '3333333333333333', { storage, fetchFn });
  assert.equal(unsaved.from, 'package');
  assert.equal(storage.has(WASM_CACHE), false, 'looking up a module creates no cache');
  assert.equal(await rememberModule(null, unsaved.copy, { storage }), false);
  assert.equal(await rememberModule('3333333333333333', null, { storage }), false);
  assert.equal(storage.entries(WASM_CACHE).size, 0);

  const broken = memoryCaches({ failOpen: true });
  const fromBroken = await instantiateModule(init, MODULE_URL, '3333333333333333', { storage: broken, fetchFn });
  assert.equal(fromBroken.from, 'package');
  assert.equal(await rememberModule('3333333333333333', fromBroken.copy, { storage: broken }), false);
  assert.deepEqual(await instantiateModule(init, MODULE_URL, '3333333333333333', { storage: null, fetchFn }), { from: 'package', copy: null });
  assert.equal(calls.length, 4);
  for (const call of calls) assert.deepEqual(call.body, MODULE);
  await forgetModules(undefined);
});

test('a packaged module that is not there is neither compiled from an error page nor cached', async () => {
  const storage = memoryCaches();
  const { init } = recordingInit();
  const { fetchFn } = countingFetch(() => new Response('gone', { status: 404 }));
  await assert.rejects(instantiateModule(init, MODULE_URL, '4444444444444444', { storage, fetchFn }), WebAssembly.CompileError);
  assert.equal(await rememberModule('4444444444444444', new Response('gone', { status: 404 }), { storage }), false);
  assert.equal(await cachedModule('4444444444444444', storage), null);
  assert.equal(storage.entries(WASM_CACHE).size, 0);
});
