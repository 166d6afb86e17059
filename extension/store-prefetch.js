// Reads what a starting engine needs from IndexedDB while the wasm module is
// still being fetched and compiled.
//
// A killed worker restarts for a Port connect; opening the database and
// reading the start image used to wait until the module was instantiated,
// although neither needs it. This module does only that IO, with no
// decisions: it opens the engine's database at exactly the engine's version,
// reads every store of the start image, and the snapshot cache's keys and
// at most one of its records, in one read-only transaction and hands the connection and the raw records to
// `Engine.start()`, which checks them and decodes them (src/platform/idb.rs
// `IdbStore::prefetched`). sw.js may send the cached snapshot read with
// it (src/engine/snapshot_cache.rs): one transaction, so the cache and the
// image are the same moment of the database. Creating
// or upgrading the database is the engine's job (its schema lives in Rust):
// when either would be needed, the open is aborted, nothing is created, and
// the engine opens the database itself as before. Any failure here means
// "no prefetch", never an error of its own.
//
// ENGINE_STORE must match src/store.rs (DB_NAME, DB_VERSION,
// stores::START_IMAGE, stores::SNAPSHOTS and its indexes); the wasm tests
// read it from here and compare.

export const ENGINE_STORE = Object.freeze({
  name: "sw-agent",
  version: 7,
  image: Object.freeze(["threads", "runs", "steers", "queue", "receipts", "approvals", "site_rules", "interactions"]),
  snapshots: "snapshots",
  // Indexes of `snapshots` (stores::SNAPSHOTS_BY_BUILD, SNAPSHOTS_RECENT).
  snapshotIndexes: Object.freeze({ build: "build", recent: "recentOf" }),
});

/**
 * Open `spec.name` at `spec.version` (never creating or upgrading it) and
 * read every store in `spec.image` whole. Of the snapshot cache, read its
 * keys, which of them `build` wrote, and one record: `build`'s most recent
 * thread's (what a fresh panel opens, and usually what a reconnecting one
 * asks for). Any other cached record is read when asked for
 * (`readCachedSnapshot`): a start never reads more than one, however many
 * threads are cached. Without a build (null), keys only.
 *
 * The most recent record is read first, and `onRecent` gets it (or null)
 * as soon as it is read, before the image's reads: a reconnect it answers
 * need not wait for the whole start image (a read-only transaction sees
 * one moment of the database, so it is the record the image's reads see).
 * @param {{ name: string, version: number, image: readonly string[], snapshots: string, snapshotIndexes: { build: string, recent: string } }} [spec]
 * @param {string | null} [build]
 * @param {(record: any) => void} [onRecent]
 * @returns {Promise<{ db: IDBDatabase, version: number, image: Record<string, unknown[]>, snapshots: { threadId: string, build?: string }[], recent: any } | null>}
 */
export function prefetchStore(spec = ENGINE_STORE, build = null, onRecent = () => {}) {
  return new Promise((resolve) => {
    let request;
    try {
      request = indexedDB.open(spec.name, spec.version);
    } catch {
      resolve(null);
      return;
    }
    request.onupgradeneeded = () => request.transaction.abort();
    request.onerror = (event) => {
      event.preventDefault();
      resolve(null);
    };
    request.onsuccess = () => {
      const db = request.result;
      const image = {};
      let keys = null;
      let current = null;
      let recent = null;
      let tx;
      try {
        tx = db.transaction([...spec.image, spec.snapshots], "readonly");
        // Requests of a transaction complete in the order they were made.
        const cache = tx.objectStore(spec.snapshots);
        if (typeof build === "string") {
          const latest = cache.index(spec.snapshotIndexes.recent).get(build);
          latest.onsuccess = () => {
            recent = latest.result ?? null;
            try {
              onRecent(recent);
            } catch {
              // The caller's problem; the prefetch goes on.
            }
          };
          const ours = cache.index(spec.snapshotIndexes.build).getAllKeys(build);
          ours.onsuccess = () => {
            current = new Set(ours.result);
          };
        }
        const allKeys = cache.getAllKeys();
        allKeys.onsuccess = () => {
          keys = allKeys.result;
        };
        for (const name of spec.image) {
          const read = tx.objectStore(name).getAll();
          read.onsuccess = () => {
            image[name] = read.result;
          };
        }
      } catch {
        db.close();
        resolve(null);
        return;
      }
      tx.oncomplete = () => {
        const snapshots = keys.map((threadId) => (current?.has(threadId) ? { threadId, build } : { threadId }));
        resolve({ db, version: db.version, image, snapshots, recent });
      };
      tx.onabort = () => {
        db.close();
        resolve(null);
      };
    };
  });
}

/**
 * The cached snapshot record of `threadId`, read on the prefetched
 * connection `db`, or null (none, or any failure).
 * @param {IDBDatabase} db
 * @param {string} threadId
 * @param {{ snapshots: string }} [spec]
 * @returns {Promise<any>}
 */
export function readCachedSnapshot(db, threadId, spec = ENGINE_STORE) {
  return new Promise((resolve) => {
    try {
      const read = db.transaction(spec.snapshots, "readonly").objectStore(spec.snapshots).get(threadId);
      read.onsuccess = () => resolve(read.result ?? null);
      read.onerror = (event) => {
        event.preventDefault();
        resolve(null);
      };
    } catch {
      resolve(null);
    }
  });
}
