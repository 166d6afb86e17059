// Serves the engine's wasm module to a starting worker from Cache Storage.
//
// Measured (BENCHMARKS.md item 17): instantiating the module from a Cache
// Storage response finishes ~4 ms earlier in a cold start than streaming it
// from the extension package (chrome-extension:// fetch), with the same
// bytes and the same compilation. So every start after the first asks the
// cache first; the first one (and any start after an update) streams the
// module from the package as before and copies it into the cache afterwards,
// off the critical path (from a tee of the response it compiled: the
// package is read once).
//
// The cache entry is keyed by the build: scripts/build.sh writes the first
// 16 hex digits of the SHA-256 of the module and its glue into the built
// manifest's `version_name` ("0.1.0 (wasm 1a2b…)"), so a cached module is
// only ever used with the JS glue of its own build, and entries of other
// builds are deleted when a new one is cached. Without a build id (an extension assembled by
// hand) the cache is not used. Any failure (no Cache Storage, a quota error,
// a damaged entry that does not instantiate) falls back to the package: the
// cache can make a start faster, never make one fail.

export const WASM_CACHE = "sw-agent-wasm";
/** The build id is the hex digest in the manifest's version_name, if any. */
const BUILD_ID = /\(wasm ([0-9a-f]{16})\)/;

/** This build's id, or null. */
export function buildId(manifest) {
  const match = BUILD_ID.exec(manifest?.version_name ?? "");
  return match ? match[1] : null;
}

/**
 * The cache key of this build's module (Cache Storage keys must be http(s)
 * requests; the host is reserved and never fetched).
 */
export function cacheKey(id) {
  return `https://sw-agent.invalid/wasm/${id}.wasm`;
}

/**
 * The cached module of build `id` as a Response, or null (no build id, not
 * cached yet, no Cache Storage).
 * @param {string | null} id
 * @param {CacheStorage | undefined} storage
 * @returns {Promise<Response | null>}
 */
export async function cachedModule(id, storage = globalThis.caches) {
  if (!id || !storage) return null;
  try {
    // One call, not open() then match(): it creates no cache when there is
    // none. (Side by side with open() then match() the cold start measured
    // the same: −3.3, +3.6 and −0.4 ms median in three runs of 6–20.)
    const hit = await storage.match(cacheKey(id), { cacheName: WASM_CACHE });
    return hit && hit.ok ? hit : null;
  } catch {
    return null;
  }
}

/**
 * Keep `response` (the packaged module's copy that instantiateModule set
 * aside) in the cache under build `id` and delete every other build's entry.
 * Resolves to whether the module is now cached.
 * @param {string | null} id
 * @param {Response | null} response
 * @param {{ storage?: CacheStorage }} [deps]
 * @returns {Promise<boolean>}
 */
export async function rememberModule(id, response, { storage = globalThis.caches } = {}) {
  if (!id || !storage || !response || !response.ok) return false;
  try {
    const cache = await storage.open(WASM_CACHE);
    const key = cacheKey(id);
    if (!(await cache.match(key))) {
      const bytes = await response.arrayBuffer();
      await cache.put(key, new Response(bytes, { headers: { "Content-Type": "application/wasm" } }));
    }
    for (const request of await cache.keys()) {
      if (request.url !== key) await cache.delete(request);
    }
    return true;
  } catch {
    return false;
  }
}

/** Forget every cached module (after a cached one failed to instantiate). */
export async function forgetModules(storage = globalThis.caches) {
  try {
    await storage?.delete(WASM_CACHE);
  } catch {
    // Nothing cached, nothing to forget.
  }
}

/**
 * Instantiate the module with `init` (wasm-bindgen's), from the cache when
 * this build's module is there, else from `url`. Resolves to where it came
 * from ("cache" or "package") and, for a packaged module that can be cached,
 * a copy of its response (`copy`, a tee of the one being compiled) for
 * rememberModule once the engine runs: the bytes are fetched once.
 * @param {(options: { module_or_path: unknown }) => Promise<unknown>} init
 * @param {string} url
 * @param {string | null} id
 * @param {{ storage?: CacheStorage, fetchFn?: typeof fetch }} [deps]
 * @returns {Promise<{ from: "cache" | "package", copy: Response | null }>}
 */
export async function instantiateModule(init, url, id, { storage = globalThis.caches, fetchFn = globalThis.fetch } = {}) {
  const cached = await cachedModule(id, storage);
  if (cached) {
    try {
      await init({ module_or_path: cached });
      return { from: "cache", copy: null };
    } catch (err) {
      console.warn("[sw-agent] the cached wasm module did not instantiate; using the packaged one", err);
      await forgetModules(storage);
    }
  }
  const response = await fetchFn(url);
  const copy = id && storage && response.ok ? response.clone() : null;
  await init({ module_or_path: response });
  return { from: "package", copy };
}
