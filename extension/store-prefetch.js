// Reads what a starting engine needs from IndexedDB while the wasm module is
// still being fetched and compiled.
//
// A killed worker restarts for a Port connect; opening the database and
// reading the start image used to wait until the module was instantiated,
// although neither needs it. This module does only that IO, with no
// decisions: it opens the engine's database at exactly the engine's version,
// reads every store of the start image and the snapshot cache in one
// read-only transaction and hands the connection and the raw records to
// `Engine.start()`, which checks them and decodes them (src/platform/idb.rs
// `IdbStore::prefetched`). sw.js may send a cached snapshot from the same
// read (src/engine/snapshot_cache.rs): one transaction, so the cache and the
// image are the same moment of the database. Creating
// or upgrading the database is the engine's job (its schema lives in Rust):
// when either would be needed, the open is aborted, nothing is created, and
// the engine opens the database itself as before. Any failure here means
// "no prefetch", never an error of its own.
//
// ENGINE_STORE must match src/store.rs (DB_NAME, DB_VERSION,
// stores::START_IMAGE, stores::SNAPSHOTS); the wasm tests read it from here
// and compare.

export const ENGINE_STORE = Object.freeze({
  name: "sw-agent",
  version: 6,
  image: Object.freeze(["threads", "runs", "steers", "queue", "receipts", "approvals", "site_rules", "interactions"]),
  snapshots: "snapshots",
});

/**
 * Open `spec.name` at `spec.version` (never creating or upgrading it) and
 * read every store in `spec.image`, and `spec.snapshots`, whole.
 * @param {{ name: string, version: number, image: readonly string[], snapshots: string }} [spec]
 * @returns {Promise<{ db: IDBDatabase, version: number, image: Record<string, unknown[]>, snapshots: unknown[] } | null>}
 */
export function prefetchStore(spec = ENGINE_STORE) {
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
      let snapshots = null;
      let tx;
      try {
        tx = db.transaction([...spec.image, spec.snapshots], "readonly");
        for (const name of spec.image) {
          const read = tx.objectStore(name).getAll();
          read.onsuccess = () => {
            image[name] = read.result;
          };
        }
        const cached = tx.objectStore(spec.snapshots).getAll();
        cached.onsuccess = () => {
          snapshots = cached.result;
        };
      } catch {
        db.close();
        resolve(null);
        return;
      }
      tx.oncomplete = () => resolve({ db, version: db.version, image, snapshots });
      tx.onabort = () => {
        db.close();
        resolve(null);
      };
    };
  });
}
