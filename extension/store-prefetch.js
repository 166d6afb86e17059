// Reads what a starting engine needs from IndexedDB while the wasm module is
// still being fetched and compiled.
//
// A killed worker restarts for a Port connect; opening the database and
// reading the start image used to wait until the module was instantiated,
// although neither needs it. This module does only that IO, with no
// decisions: it opens the engine's database at exactly the engine's version,
// reads every store of the start image in one read-only transaction and
// hands the connection and the raw records to `Engine.start()`, which checks
// them and decodes them (src/platform/idb.rs `IdbStore::prefetched`). Creating
// or upgrading the database is the engine's job (its schema lives in Rust):
// when either would be needed, the open is aborted, nothing is created, and
// the engine opens the database itself as before. Any failure here means
// "no prefetch", never an error of its own.
//
// ENGINE_STORE must match src/store.rs (DB_NAME, DB_VERSION,
// stores::START_IMAGE); the wasm tests read it from here and compare.

export const ENGINE_STORE = Object.freeze({
  name: "sw-agent",
  version: 5,
  image: Object.freeze(["threads", "runs", "steers", "queue", "receipts", "approvals", "site_rules", "interactions"]),
});

/**
 * Open `spec.name` at `spec.version` (never creating or upgrading it) and
 * read every store in `spec.image` whole.
 * @param {{ name: string, version: number, image: readonly string[] }} [spec]
 * @returns {Promise<{ db: IDBDatabase, version: number, image: Record<string, unknown[]> } | null>}
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
      let tx;
      try {
        tx = db.transaction(spec.image, "readonly");
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
      tx.oncomplete = () => resolve({ db, version: db.version, image });
      tx.onabort = () => {
        db.close();
        resolve(null);
      };
    };
  });
}
