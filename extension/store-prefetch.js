// Reads what a starting engine needs from IndexedDB while the wasm module is
// still being fetched and compiled.
//
// A killed worker restarts for a Port connect; opening the database and
// reading the start image used to wait until the module was instantiated,
// although neither needs it. This module does only that IO, with no
// decisions: it opens the engine's database at exactly the engine's version,
// reads every store of the start image, and the snapshot cache's keys and
// at most two of its records (the most recent thread's, and one a panel
// asked for meanwhile), in one read-only transaction (of the runs, the
// unfinished ones only, through their `state` index), and hands the
// connection and the raw records to `Engine.start()`, which checks them and decodes them (src/platform/idb.rs
// `IdbStore::prefetched`). sw.js may send the cached snapshot read with
// it (src/engine/snapshot_cache.rs): one transaction, so the cache and the
// image are the same moment of the database. Creating
// or upgrading the database is the engine's job (its schema lives in Rust):
// when either would be needed, the open is aborted, nothing is created, and
// the engine opens the database itself as before. Any failure here means
// "no prefetch", never an error of its own.
//
// ENGINE_STORE must match src/store.rs (DB_NAME, DB_VERSION,
// stores::START_IMAGE, stores::SNAPSHOTS and its indexes, stores::RUNS_BY_STATE)
// and src/model.rs (RunState::TERMINAL_NAMES); the wasm tests read it from
// here and compare.

export const ENGINE_STORE = Object.freeze({
  name: "sw-agent",
  version: 8,
  // Not the command receipts: the engine reads them right after it starts
  // (only a command needs them; a long-used profile holds thousands).
  image: Object.freeze(["threads", "runs", "steers", "queue", "approvals", "site_rules", "interactions"]),
  snapshots: "snapshots",
  // Indexes of `snapshots` (stores::SNAPSHOTS_BY_BUILD, SNAPSHOTS_RECENT).
  snapshotIndexes: Object.freeze({ build: "build", recent: "recentOf" }),
  // Of the runs, a start reads those whose state is not terminal, through
  // their `state` index (stores::RUNS_BY_STATE; the terminal states as
  // stored, in key order: RunState::TERMINAL_NAMES).
  runsByState: Object.freeze({
    store: "runs",
    index: "state",
    terminal: Object.freeze(["budget_paused", "completed", "failed", "interrupted"]),
  }),
});

/**
 * Reads the runs a start needs from `store` (the runs): every record whose
 * `state` key is none of `terminal`, i.e. everything between and around
 * them in the index (as src/store.rs `unfinished_run_states`), then calls
 * `done` with them. Requests of a transaction complete in the order they
 * were made, so the last one's success means all are read.
 * @param {IDBObjectStore} store
 * @param {{ index: string, terminal: readonly string[] }} byState
 * @param {(records: unknown[]) => void} done
 */
function readUnfinishedRuns(store, byState, done) {
  const terminal = byState.terminal;
  const ranges = [IDBKeyRange.upperBound(terminal[0], true)];
  for (let i = 1; i < terminal.length; i += 1) ranges.push(IDBKeyRange.bound(terminal[i - 1], terminal[i], true, true));
  ranges.push(IDBKeyRange.lowerBound(terminal[terminal.length - 1], true));
  const index = store.index(byState.index);
  const parts = [];
  ranges.forEach((range, i) => {
    const read = index.getAll(range);
    read.onsuccess = () => {
      parts[i] = read.result;
      if (i === ranges.length - 1) done(parts.flat());
    };
  });
}

// Start-image stores that grow with use (finished runs,
// answered approvals and questions, kept for the retention period): read
// last (see prefetchStore).
const GROWING = new Set(["runs", "approvals", "interactions"]);

/**
 * Open `spec.name` at `spec.version` (never creating or upgrading it) and
 * read every store in `spec.image` whole. Of the snapshot cache, read its
 * keys, which of them `build` wrote, and one record: `build`'s most recent
 * thread's (what a fresh panel opens, and usually what a reconnecting one
 * asks for). Another cached record is read only when a panel asks for it
 * (`hooks.wanted` below, or `readCachedSnapshot` later): a start reads at
 * most two, however many threads are cached. Without a build (null), keys
 * only.
 *
 * A reconnect need not wait for the whole start image (a read-only
 * transaction sees one moment of the database, so these are the records
 * the image's reads see): the most recent record is read first and
 * `hooks.onRecent` gets it (or null) as soon as it is read; then, if
 * `hooks.wanted()` names another thread by the time the cache's keys, or
 * the image's first batch, are read (a panel asked for it meanwhile), that
 * thread's record is read next and `hooks.onWanted` gets the thread and its
 * record (or null). Chrome runs the transactions of a database one after
 * the other, so a read in a transaction of its own would wait for the
 * whole image. None is called when the database cannot be opened as it is.
 * @param {{ name: string, version: number, image: readonly string[], snapshots: string, snapshotIndexes: { build: string, recent: string }, runsByState?: { store: string, index: string, terminal: readonly string[] } }} [spec]
 * @param {string | null} [build]
 * @param {{ onRecent?: (record: any) => void, wanted?: () => string | null, onWanted?: (threadId: string, record: any) => void }} [hooks]
 * @returns {Promise<{ db: IDBDatabase, version: number, image: Record<string, unknown[]>, snapshots: { threadId: string, build?: string }[], recent: any } | null>}
 */
export function prefetchStore(spec = ENGINE_STORE, build = null, hooks = {}) {
  // A hook that throws is the caller's problem; the prefetch goes on.
  const hook = (name, ...args) => {
    try {
      return hooks?.[name]?.(...args);
    } catch {
      return undefined;
    }
  };
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
            hook("onRecent", recent);
          };
          const ours = cache.index(spec.snapshotIndexes.build).getAllKeys(build);
          ours.onsuccess = () => {
            current = new Set(ours.result);
          };
        }
        // The thread a panel asked for by now, read next (once).
        let askedFor = false;
        const readWanted = () => {
          const wanted = askedFor || typeof build !== "string" ? null : hook("wanted");
          if (typeof wanted !== "string") return;
          askedFor = true;
          if (wanted === recent?.threadId) return;
          const one = cache.get(wanted);
          one.onsuccess = () => hook("onWanted", wanted, one.result ?? null);
        };
        // The image in two batches, each issued from the last callback of
        // what came before (a transaction is active in its requests'
        // callbacks): the stores of the threads' current state, then
        // those that grow with use within the retention. A panel's ask
        // that arrives while the first batch is read is still read before
        // the second.
        const batches = [
          spec.image.filter((name) => !GROWING.has(name)),
          spec.image.filter((name) => GROWING.has(name)),
        ].filter((batch) => batch.length > 0);
        const readBatch = (at) => {
          readWanted();
          const batch = batches[at];
          if (!batch) return;
          batch.forEach((name, i) => {
            const done = (records) => {
              image[name] = records;
              if (i === batch.length - 1) readBatch(at + 1);
            };
            if (name === spec.runsByState?.store) {
              readUnfinishedRuns(tx.objectStore(name), spec.runsByState, done);
              return;
            }
            const read = tx.objectStore(name).getAll();
            read.onsuccess = () => done(read.result);
          });
        };
        const allKeys = cache.getAllKeys();
        allKeys.onsuccess = () => {
          keys = allKeys.result;
          readBatch(0);
        };
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
