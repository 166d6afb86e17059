//! The IndexedDB store: rexie opens (creates, upgrades) the database and
//! reads; commits, and a cold `initialize`'s read of a thread's newest
//! nodes, go through a second, plain connection to it. At a worker's start
//! that plain connection and the start image usually come from
//! `extension/store-prefetch.js`, read while the module compiled
//! (`IdbStore::prefetched`); rexie's connection then opens on first use.
//!
//! One `UnitOfWork` = one readwrite transaction over exactly the stores it
//! touches. Every put and delete is issued synchronously, then only the
//! transaction's `complete` (or `abort`) is awaited, so it cannot
//! auto-commit early and nothing else runs inside it.
//!
//! Durability: commits ask for "relaxed" (also Chrome's default; rexie has
//! no option for it). `complete` therefore means the write is committed and
//! visible to every later reader, survives the service worker being killed
//! and the browser being closed or crashing, but may be lost if the
//! operating system crashes or the machine loses power before the OS
//! flushes its buffers. That is what an ACK promises (see README "What an
//! ACK means"). "strict" would cost every checkpoint an OS flush (the bench
//! floor: ~1.2 vs ~0.7 ms per commit here) for a failure the service worker
//! model does not produce.

use futures::future::join_all;
use rexie::{Direction, Index, KeyRange, ObjectStore, Rexie, TransactionMode};
use serde::Serialize;
use serde_json::Value;
use wasm_bindgen::JsValue;

use crate::model::{
    ApprovalRecord, EnvironmentRecord, FromRecord, InteractionRecord, Node, PendingSteer,
    QueueItem, Receipt, Run, SiteRule, Thread,
};
use crate::store::{
    stores, threads_to_load, CachedKey, Record, StoreError, StoreImage, UnitOfWork,
};

use crate::store::DB_VERSION;

fn store_error(e: impl std::fmt::Display) -> StoreError {
    StoreError {
        message: format!("IndexedDB: {e}"),
        retryable: true,
    }
}

/// A DOMException or other JS error as a store error (`Name: message`).
fn js_store_error(e: JsValue) -> StoreError {
    store_error(super::error::js_to_error(e))
}

/// A readwrite transaction asking for relaxed durability explicitly (see
/// the module note). `IDBTransactionOptions` is behind web-sys's unstable
/// flag, so the call goes through `Reflect`; a browser that does not know
/// the option ignores it.
fn readwrite(
    raw: &web_sys::IdbDatabase,
    names: &js_sys::Array,
) -> Result<web_sys::IdbTransaction, StoreError> {
    use wasm_bindgen::JsCast;
    let options = js_sys::Object::new();
    js_sys::Reflect::set(
        &options,
        &JsValue::from_str("durability"),
        &JsValue::from_str("relaxed"),
    )
    .map_err(js_store_error)?;
    let transaction: js_sys::Function =
        js_sys::Reflect::get(raw, &JsValue::from_str("transaction"))
            .and_then(|f| f.dyn_into())
            .map_err(js_store_error)?;
    transaction
        .call3(raw, names, &JsValue::from_str("readwrite"), &options)
        .and_then(|tx| tx.dyn_into())
        .map_err(js_store_error)
}

/// Open a plain connection to a database that already has `DB_VERSION`.
async fn open_raw(name: &str) -> Result<web_sys::IdbDatabase, StoreError> {
    use wasm_bindgen::JsCast;
    let factory: web_sys::IdbFactory =
        js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("indexedDB"))
            .and_then(|f| f.dyn_into())
            .map_err(js_store_error)?;
    let request = factory
        .open_with_u32(name, DB_VERSION)
        .map_err(js_store_error)?;
    request_result(&request, "could not open the database")
        .await?
        .dyn_into()
        .map_err(js_store_error)
}

/// Wait for one IndexedDB request: its result, or its error as a store error
/// (`otherwise` when the request names none).
async fn request_result(
    request: &web_sys::IdbRequest,
    otherwise: &str,
) -> Result<JsValue, StoreError> {
    let done = js_sys::Promise::new(&mut |resolve, reject| {
        request.set_onsuccess(Some(&resolve));
        request.set_onerror(Some(&reject));
    });
    let outcome = wasm_bindgen_futures::JsFuture::from(done).await;
    request.set_onsuccess(None);
    request.set_onerror(None);
    if outcome.is_err() {
        return Err(match request.error() {
            Ok(Some(e)) => js_store_error(e.into()),
            _ => store_error(otherwise),
        });
    }
    request.result().map_err(js_store_error)
}

fn to_js<T: Serialize>(value: &T) -> Result<JsValue, StoreError> {
    super::boundary::to_js(value).map_err(|e| StoreError {
        message: format!("could not encode a record: {e}"),
        retryable: false,
    })
}

/// Decode every record, skipping (and reporting) the ones that do not decode:
/// one damaged record must not make the whole database unreadable. Records
/// but nodes are decoded by hand from their JSON data (`model::FromRecord`).
///
/// Many records (a long-used profile's thousands of receipts) cross the
/// boundary as one JSON text: one `JSON.stringify` of them all and one parse
/// in wasm, instead of walking every object field by field (BENCHMARKS.md
/// item 31). The engine writes records as JSON data (`boundary::to_js`), so
/// both ways read the same values; if the text cannot be made or parsed
/// (a record holding something that is not JSON data), each record is
/// decoded on its own, as with a few.
/// The records a `getAll` request of `store` returns, decoded, and the
/// ones that could not be (`otherwise`: the error text if it fails).
async fn records_of<T: FromRecord>(
    request: &web_sys::IdbRequest,
    store: &str,
    otherwise: &str,
) -> Result<(Vec<T>, Skipped), StoreError> {
    let values = request_result(request, otherwise).await?;
    let mut skipped = Vec::new();
    let records = decode_all(js_sys::Array::from(&values).to_vec(), store, &mut skipped);
    Ok((records, skipped))
}

fn decode_all<T: FromRecord>(
    values: Vec<JsValue>,
    store: &str,
    skipped: &mut Vec<String>,
) -> Vec<T> {
    decode_each(json_data(values), store, skipped, |v| T::from_record(v?))
}

/// From how many records [`decode_all`] reads them as one JSON text.
const BULK_DECODE_MIN: usize = 32;

/// Each record's JSON data (not generic: one copy in the module).
fn json_data(values: Vec<JsValue>) -> Vec<Result<Value, String>> {
    if values.len() >= BULK_DECODE_MIN {
        if let Some(all) = json_text_values(&values) {
            return all.into_iter().map(Ok).collect();
        }
    }
    values
        .into_iter()
        .map(super::boundary::from_js::<Value>)
        .collect()
}

/// `values` as JSON data through one JSON text, if every one of them is.
fn json_text_values(values: &[JsValue]) -> Option<Vec<Value>> {
    let array: js_sys::Array = values.iter().collect();
    let text = js_sys::JSON::stringify(&array).ok()?.as_string()?;
    let parsed: Vec<Value> = serde_json::from_str(&text).ok()?;
    (parsed.len() == values.len()).then_some(parsed)
}

/// Nodes, the most numerous records, decode straight from the JS objects
/// (`model::node_de`): a cold start's tail of a thread is its largest read.
fn decode_node_values(values: Vec<JsValue>, skipped: &mut Vec<String>) -> Vec<Node> {
    decode_each(
        values,
        stores::NODES,
        skipped,
        super::boundary::from_js::<Node>,
    )
}

fn decode_each<V, T>(
    values: Vec<V>,
    store: &str,
    skipped: &mut Vec<String>,
    decode: impl Fn(V) -> Result<T, String>,
) -> Vec<T> {
    values
        .into_iter()
        .filter_map(|v| match decode(v) {
            Ok(x) => Some(x),
            Err(e) => {
                skipped.push(format!("{store}: {e}"));
                None
            }
        })
        .collect()
}

/// The run records a start needs, through the runs' `state` index: those
/// whose state is not terminal (`store::unfinished_run_states`), not every
/// run kept for the retention. A record without a valid `state` key is in
/// no index and is read with its thread (`IdbStore::thread_runs`). One range
/// after the other: this is the start without a prefetch (the prefetch
/// issues them together), and one `join_all` more costs the module 4 KB.
async fn unfinished_runs(store: &rexie::Store) -> Result<Vec<JsValue>, StoreError> {
    let index = store.index(stores::RUNS_BY_STATE).map_err(store_error)?;
    let mut runs = Vec::new();
    for (lower, upper) in crate::store::unfinished_run_states() {
        let key = |k: Option<&str>| k.map(JsValue::from_str);
        let range = match (key(lower), key(upper)) {
            (Some(l), Some(u)) => KeyRange::bound(&l, &u, Some(true), Some(true)).map(Some),
            (Some(l), None) => KeyRange::lower_bound(&l, Some(true)).map(Some),
            (None, Some(u)) => KeyRange::upper_bound(&u, Some(true)).map(Some),
            (None, None) => Ok(None),
        }
        .map_err(store_error)?;
        runs.extend(index.get_all(range, None).await.map_err(store_error)?);
    }
    Ok(runs)
}

/// A key of the nodes' `threadTime` index: `[threadId, createdAt]`.
fn thread_time_key(thread_id: &str, time: f64) -> JsValue {
    js_sys::Array::of2(&JsValue::from_str(thread_id), &JsValue::from_f64(time)).into()
}

/// Open (create, upgrade) the database through rexie, with the schema.
async fn open_rexie(name: &str) -> Result<Rexie, StoreError> {
    let by_thread = || Index::new("threadId", "threadId");
    Rexie::builder(name)
        .version(DB_VERSION)
        .add_object_store(ObjectStore::new(stores::THREADS).key_path("id"))
        .add_object_store(
            ObjectStore::new(stores::NODES)
                .key_path("id")
                .add_index(by_thread())
                .add_index(Index::new_array("threadTime", ["threadId", "createdAt"])),
        )
        .add_object_store(
            ObjectStore::new(stores::RUNS)
                .key_path("id")
                .add_index(by_thread())
                .add_index(Index::new(stores::RUNS_BY_STATE, "state")),
        )
        .add_object_store(
            ObjectStore::new(stores::STEERS)
                .key_path("id")
                .add_index(by_thread()),
        )
        .add_object_store(
            ObjectStore::new(stores::QUEUE)
                .key_path("id")
                .add_index(by_thread()),
        )
        .add_object_store(ObjectStore::new(stores::RECEIPTS).key_path("key"))
        .add_object_store(
            ObjectStore::new(stores::APPROVALS)
                .key_path("id")
                .add_index(by_thread()),
        )
        .add_object_store(ObjectStore::new(stores::SITE_RULES).key_path("origin"))
        .add_object_store(
            ObjectStore::new(stores::INTERACTIONS)
                .key_path("id")
                .add_index(by_thread()),
        )
        .add_object_store(ObjectStore::new(stores::ENVIRONMENTS).key_path("runId"))
        .add_object_store(
            ObjectStore::new(stores::SNAPSHOTS)
                .key_path("threadId")
                .add_index(Index::new(stores::SNAPSHOTS_BY_BUILD, "build"))
                .add_index(Index::new(stores::SNAPSHOTS_RECENT, "recentOf")),
        )
        .build()
        .await
        .map_err(store_error)
}

/// The engine's IndexedDB database.
pub struct IdbStore {
    /// rexie's connection: it creates and upgrades the database and reads.
    /// Opened with the store, or on first use when the store started from
    /// a prefetch (which already holds a connection at `DB_VERSION`).
    db: futures::lock::Mutex<Option<std::rc::Rc<Rexie>>>,
    /// A second connection to the same database, opened after rexie's has
    /// created or upgraded it. Commits go through it directly: every put is
    /// issued in one go and only the transaction's completion is awaited
    /// (rexie awaits each request, one wake-up of the Rust task per record).
    /// Opened with the store, or on the first commit.
    raw: std::cell::RefCell<Option<web_sys::IdbDatabase>>,
    name: String,
}

/// Records that could not be decoded (left untouched in the database).
pub type Skipped = Vec<String>;

impl IdbStore {
    /// Open (creating or upgrading) the database `name`.
    pub async fn open(name: &str) -> Result<Self, StoreError> {
        let store = Self::open_only(name).await?;
        store.raw().await?;
        Ok(store)
    }

    /// Open (create, upgrade) through rexie; the commit connection follows.
    async fn open_only(name: &str) -> Result<Self, StoreError> {
        let db = open_rexie(name).await?;
        Ok(IdbStore {
            db: futures::lock::Mutex::new(Some(std::rc::Rc::new(db))),
            raw: Default::default(),
            name: name.to_string(),
        })
    }

    /// rexie's connection, opened on first use.
    async fn rexie(&self) -> Result<std::rc::Rc<Rexie>, StoreError> {
        let mut db = self.db.lock().await;
        if let Some(db) = db.as_ref() {
            return Ok(db.clone());
        }
        let opened = std::rc::Rc::new(open_rexie(&self.name).await?);
        *db = Some(opened.clone());
        Ok(opened)
    }

    /// The store from what `extension/store-prefetch.js` read while the
    /// module compiled: `{ db, version, image: { store: [records] },
    /// snapshots: [{ threadId, build? }] }` (the snapshot cache's keys, with
    /// the build for those this build wrote). None (and the prefetched
    /// connection closed) unless it is a connection to `name` at
    /// `DB_VERSION` with every start-image store and the snapshot cache's
    /// keys read; the caller then opens the database itself. The engine
    /// never reads a cached snapshot: the worker script sends them.
    pub fn prefetched(
        name: &str,
        prefetch: &JsValue,
    ) -> Option<(Self, Vec<Vec<JsValue>>, Vec<CachedKey>)> {
        use wasm_bindgen::JsCast;
        let field =
            |of: &JsValue, key: &str| js_sys::Reflect::get(of, &JsValue::from_str(key)).ok();
        let raw: web_sys::IdbDatabase = field(prefetch, "db")?.dyn_into().ok()?;
        let image = field(prefetch, "image");
        let values = image.and_then(|image| {
            stores::START_IMAGE
                .iter()
                .map(|store| {
                    let records = field(&image, store)?;
                    records
                        .is_array()
                        .then(|| js_sys::Array::from(&records).to_vec())
                })
                .collect::<Option<Vec<_>>>()
        });
        let cached = field(prefetch, "snapshots")
            .filter(|v| v.is_array())
            .map(|records| {
                js_sys::Array::from(&records)
                    .iter()
                    .filter_map(|record| {
                        let text = |key| field(&record, key).and_then(|v| v.as_string());
                        Some(CachedKey {
                            thread_id: text("threadId")?,
                            build: text("build"),
                        })
                    })
                    .collect::<Vec<_>>()
            });
        match (values, cached) {
            (Some(values), Some(cached))
                if raw.name() == name && raw.version() == f64::from(DB_VERSION) =>
            {
                let store = IdbStore {
                    db: futures::lock::Mutex::new(None),
                    raw: std::cell::RefCell::new(Some(raw)),
                    name: name.to_string(),
                };
                Some((store, values, cached))
            }
            _ => {
                raw.close();
                None
            }
        }
    }

    /// Open the database and read the start image, the commit connection
    /// opening while the image is read (what `Engine.start()` needs first).
    /// Also returns when the database was open (`precise_now`), for metrics.
    pub async fn open_with_image(
        name: &str,
    ) -> Result<(Self, StoreImage, Skipped, f64), StoreError> {
        let store = Self::open_only(name).await?;
        let opened = super::metrics::precise_now();
        let (raw, image) = futures::join!(store.raw(), store.load_image());
        raw?;
        let (image, skipped) = image?;
        Ok((store, image, skipped, opened))
    }

    /// The commit connection, opened on first use.
    async fn raw(&self) -> Result<web_sys::IdbDatabase, StoreError> {
        if let Some(raw) = self.raw.borrow().as_ref() {
            return Ok(raw.clone());
        }
        let raw = open_raw(&self.name).await?;
        *self.raw.borrow_mut() = Some(raw.clone());
        Ok(raw)
    }

    pub fn close(self) {
        if let Some(raw) = self.raw.borrow_mut().take() {
            raw.close();
        }
        if let Some(db) = self
            .db
            .into_inner()
            .and_then(|db| std::rc::Rc::try_unwrap(db).ok())
        {
            db.close();
        }
    }

    /// Delete the database `name` (tests).
    pub async fn delete(name: &str) -> Result<(), StoreError> {
        Rexie::delete(name).await.map_err(store_error)
    }

    /// Commit a unit of work in one readwrite transaction.
    pub async fn commit(&self, unit: &UnitOfWork) -> Result<(), StoreError> {
        if unit.is_empty() {
            return Ok(());
        }
        let puts = Self::encode(unit)?;
        self.commit_values(&unit.store_names(), &puts, &unit.deletes)
            .await
    }

    /// A unit's records as JS values, ready for `commit_values`. Everything
    /// is encoded before the transaction opens: no work but IndexedDB
    /// requests happens while it is active.
    pub fn encode(unit: &UnitOfWork) -> Result<Vec<(&'static str, JsValue)>, StoreError> {
        let mut puts = Vec::with_capacity(unit.puts.len());
        for record in &unit.puts {
            let value = match record {
                Record::Thread(x) => to_js(x)?,
                Record::Node(x) => to_js(x)?,
                Record::Run(x) => to_js(x)?,
                Record::Steer(x) => to_js(x)?,
                Record::QueueItem(x) => to_js(x)?,
                Record::Receipt(x) => to_js(x)?,
                Record::Approval(x) => to_js(x)?,
                Record::SiteRule(x) => to_js(x)?,
                Record::Interaction(x) => to_js(x)?,
                Record::Environment(x) => to_js(x)?,
                // Already JSON text (the engine measured it).
                Record::Snapshot(x) => js_sys::JSON::parse(&x.json).map_err(|_| StoreError {
                    message: "could not encode a cached snapshot".to_string(),
                    retryable: false,
                })?,
            };
            puts.push((record.store_name(), value));
        }
        Ok(puts)
    }

    /// Encoded records in one readwrite transaction, all or nothing.
    pub async fn commit_values(
        &self,
        stores: &[&str],
        puts: &[(&'static str, JsValue)],
        deletes: &[crate::store::RecordKey],
    ) -> Result<(), StoreError> {
        let names = js_sys::Array::new();
        for name in stores {
            names.push(&JsValue::from_str(name));
        }
        let raw = self.raw().await?;
        let tx = readwrite(&raw, &names)?;
        // The transaction ends in `complete` or `abort` (a failed request
        // aborts it: its error event is not cancelled).
        let done = js_sys::Promise::new(&mut |resolve, reject| {
            tx.set_oncomplete(Some(&resolve));
            tx.set_onabort(Some(&reject));
        });
        let issued = (|| -> Result<(), JsValue> {
            for (name, value) in puts {
                tx.object_store(name)?.put(value)?;
            }
            for key in deletes {
                tx.object_store(key.store)?
                    .delete(&JsValue::from_str(&key.key))?;
            }
            Ok(())
        })();
        if let Err(e) = issued {
            // A record the store refuses (no key, not cloneable) never will.
            let _ = tx.abort();
            let mut error = js_store_error(e);
            error.retryable = false;
            return Err(error);
        }
        let outcome = wasm_bindgen_futures::JsFuture::from(done).await;
        tx.set_oncomplete(None);
        tx.set_onabort(None);
        match outcome {
            Ok(_) => Ok(()),
            Err(_) => Err(match tx.error() {
                Some(e) => js_store_error(e.into()),
                None => store_error("the transaction was aborted"),
            }),
        }
    }

    /// Read what a starting engine needs (see [`StoreImage`]).
    pub async fn load_image(&self) -> Result<(StoreImage, Skipped), StoreError> {
        let db = self.rexie().await?;
        let mut scope = stores::START_IMAGE.to_vec();
        scope.push(stores::SNAPSHOTS);
        let tx = db
            .transaction(&scope, TransactionMode::ReadOnly)
            .map_err(store_error)?;
        // Of the snapshot cache the keys only: this engine never sends a
        // cached snapshot, it only deletes them (no build: none is current).
        let reads = scope.iter().map(|name| {
            let store = tx.store(name);
            let name = *name;
            async move {
                let store = store.map_err(store_error)?;
                match name {
                    stores::RUNS => unfinished_runs(&store).await,
                    stores::SNAPSHOTS => store.get_all_keys(None, None).await.map_err(store_error),
                    _ => store.get_all(None, None).await.map_err(store_error),
                }
            }
        });
        let mut values = join_all(reads)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let cached = values
            .pop()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|k| k.as_string())
            .map(|thread_id| CachedKey {
                thread_id,
                build: None,
            })
            .collect();
        drop(tx);
        self.image_from(values, cached).await
    }

    /// The start image from the records of `stores::START_IMAGE` (in that
    /// order), read here or prefetched: decoded, plus what only some
    /// records need (unfinished runs' environments, their threads' nodes).
    pub async fn image_from(
        &self,
        values: Vec<Vec<JsValue>>,
        snapshots: Vec<CachedKey>,
    ) -> Result<(StoreImage, Skipped), StoreError> {
        let mut skipped = Vec::new();
        let [threads, runs, steers, queue, approvals, site_rules, interactions]: [Vec<JsValue>; 7] =
            values
                .try_into()
                .map_err(|_| store_error("the start image lacks a store"))?;
        let threads: Vec<Thread> = decode_all(threads, stores::THREADS, &mut skipped);
        // Only unfinished runs were read (`unfinished_runs`, the prefetch's
        // `readUnfinishedRuns`); the threads loaded at start get all their
        // runs below, the others when they load (`thread_runs`).
        let mut runs: Vec<Run> = decode_all(runs, stores::RUNS, &mut skipped);
        let steers: Vec<PendingSteer> = decode_all(steers, stores::STEERS, &mut skipped);
        let queue: Vec<QueueItem> = decode_all(queue, stores::QUEUE, &mut skipped);
        let approvals: Vec<ApprovalRecord> = decode_all(approvals, stores::APPROVALS, &mut skipped);
        let site_rules: Vec<SiteRule> = decode_all(site_rules, stores::SITE_RULES, &mut skipped);
        let interactions: Vec<InteractionRecord> =
            decode_all(interactions, stores::INTERACTIONS, &mut skipped);
        // Only unfinished runs need their frozen environment (to refuse drift
        // on resume); finished runs' environments stay on disk. Own
        // transaction, every request issued before the first is awaited.
        let unfinished: Vec<JsValue> = runs
            .iter()
            .filter(|r| !r.state.is_terminal())
            .map(|r| JsValue::from_str(&r.id))
            .collect();
        let mut environment_values = Vec::new();
        if !unfinished.is_empty() {
            let db = self.rexie().await?;
            let tx = db
                .transaction(&[stores::ENVIRONMENTS], TransactionMode::ReadOnly)
                .map_err(store_error)?;
            let store = tx.store(stores::ENVIRONMENTS).map_err(store_error)?;
            let found = join_all(unfinished.iter().map(|key| store.get(key.clone()))).await;
            for value in found {
                if let Some(value) = value.map_err(store_error)? {
                    environment_values.push(value);
                }
            }
        }
        let environments: Vec<EnvironmentRecord> =
            decode_all(environment_values, stores::ENVIRONMENTS, &mut skipped);
        let loaded_threads = threads_to_load(&runs, &queue);
        // One thread after the other: a start loads the threads of unfinished
        // runs, usually none or one (issuing them all at once measured 6 KB
        // more code for nothing a start would notice).
        let mut nodes = Vec::new();
        for thread_id in &loaded_threads {
            let (values, thread_runs) = futures::join!(
                self.thread_node_values(thread_id),
                self.thread_runs(thread_id)
            );
            nodes.extend(decode_node_values(values?, &mut skipped));
            let (thread_runs, not_decoded) = thread_runs?;
            skipped.extend(not_decoded);
            for run in thread_runs {
                if !runs.iter().any(|r| r.id == run.id) {
                    runs.push(run);
                }
            }
        }
        let image = StoreImage {
            threads,
            runs,
            steers,
            queue,
            receipts: Vec::new(),
            approvals,
            site_rules,
            interactions,
            environments,
            nodes,
            loaded_threads,
            snapshots,
            receipts_deferred: true,
        };
        Ok((image, skipped))
    }

    /// An index of `store` on the commit connection, in a read-only
    /// transaction of its own (which lives while a request on it is pending).
    async fn raw_index(&self, store: &str, index: &str) -> Result<web_sys::IdbIndex, StoreError> {
        self.raw()
            .await?
            .transaction_with_str(store)
            .and_then(|tx| tx.object_store(store))
            .and_then(|s| s.index(index))
            .map_err(js_store_error)
    }

    /// Every stored command receipt (one request on the commit connection),
    /// and the records that could not be decoded.
    pub async fn receipts(&self) -> Result<(Vec<Receipt>, Skipped), StoreError> {
        let request = self
            .raw()
            .await?
            .transaction_with_str(stores::RECEIPTS)
            .and_then(|tx| tx.object_store(stores::RECEIPTS))
            .and_then(|store| store.get_all())
            .map_err(js_store_error)?;
        records_of(
            &request,
            stores::RECEIPTS,
            "could not read the command receipts",
        )
        .await
    }

    /// Every stored run of one thread (the `threadId` index, one request on
    /// the commit connection), and the records that could not be decoded.
    pub async fn thread_runs(&self, thread_id: &str) -> Result<(Vec<Run>, Skipped), StoreError> {
        let request = self
            .raw_index(stores::RUNS, "threadId")
            .await?
            .get_all_with_key(&JsValue::from_str(thread_id))
            .map_err(js_store_error)?;
        records_of(&request, stores::RUNS, "could not read the thread's runs").await
    }

    /// All nodes of one thread, and the records that could not be decoded.
    pub async fn thread_nodes(&self, thread_id: &str) -> Result<(Vec<Node>, Skipped), StoreError> {
        Ok(Self::decode_nodes(
            self.thread_node_values(thread_id).await?,
        ))
    }

    /// One index of the nodes store, in a read-only transaction of its own
    /// (kept alive by the caller while it reads).
    async fn nodes_index(
        &self,
        name: &str,
    ) -> Result<(rexie::Transaction, rexie::StoreIndex), StoreError> {
        let tx = self
            .rexie()
            .await?
            .transaction(&[stores::NODES], TransactionMode::ReadOnly)
            .map_err(store_error)?;
        let index = tx
            .store(stores::NODES)
            .and_then(|s| s.index(name))
            .map_err(store_error)?;
        Ok((tx, index))
    }

    /// The stored values of a thread's nodes; `decode_nodes` turns them into
    /// nodes (two steps so the driver can time them apart).
    pub async fn thread_node_values(&self, thread_id: &str) -> Result<Vec<JsValue>, StoreError> {
        let (_tx, index) = self.nodes_index("threadId").await?;
        let range = KeyRange::only(&JsValue::from_str(thread_id)).map_err(store_error)?;
        index.get_all(Some(range), None).await.map_err(store_error)
    }

    /// The stored values of a thread's newest `count` nodes by creation
    /// time (plus any created in the same millisecond as the oldest of them),
    /// and whether that is the whole thread: one `getAllRecords` request
    /// where the browser has it (`tail_by_records`), otherwise (or when
    /// creation times tie across the boundary) `tail_by_cursor`.
    pub async fn thread_tail_values(
        &self,
        thread_id: &str,
        count: usize,
    ) -> Result<(Vec<JsValue>, bool), StoreError> {
        match self.tail_by_records(thread_id, count).await? {
            Some(tail) => Ok(tail),
            None => self.tail_by_cursor(thread_id, count).await,
        }
    }

    /// `thread_tail_values` in one request on the commit connection:
    /// `IDBIndex.getAllRecords()` (Chrome 141+) over `threadTime`, newest
    /// first, `count + 1` records. None where the browser lacks it, or when
    /// the `count`-th and the next record share a creation time (more may
    /// share it: the cursor read takes them all).
    pub async fn tail_by_records(
        &self,
        thread_id: &str,
        count: usize,
    ) -> Result<Option<(Vec<JsValue>, bool)>, StoreError> {
        use wasm_bindgen::JsCast;
        let index = self.raw_index(stores::NODES, "threadTime").await?;
        let Some(get_all_records) = js_sys::Reflect::get(&index, &"getAllRecords".into())
            .ok()
            .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
        else {
            return Ok(None);
        };
        let query = web_sys::IdbKeyRange::bound(
            &thread_time_key(thread_id, f64::NEG_INFINITY),
            &thread_time_key(thread_id, f64::INFINITY),
        )
        .map_err(js_store_error)?;
        let options = js_sys::Object::new();
        for (name, value) in [
            ("query", JsValue::from(query)),
            ("count", JsValue::from_f64((count.max(1) + 1) as f64)),
            ("direction", JsValue::from_str("prev")),
        ] {
            js_sys::Reflect::set(&options, &name.into(), &value).map_err(js_store_error)?;
        }
        let request: web_sys::IdbRequest = get_all_records
            .call1(&index, &options)
            .and_then(|r| r.dyn_into())
            .map_err(js_store_error)?;
        let records = js_sys::Array::from(
            &request_result(&request, "could not read the thread's newest nodes").await?,
        );
        let field = |record: &JsValue, name: &str| js_sys::Reflect::get(record, &name.into());
        let time = |at: u32| {
            field(&records.get(at), "key")
                .ok()
                .map(|key| js_sys::Array::from(&key).get(1))
                .and_then(|t| t.as_f64())
        };
        let wanted = count.max(1) as u32;
        let complete = records.length() <= wanted;
        if !complete && (time(wanted - 1).is_none() || time(wanted - 1) == time(wanted)) {
            return Ok(None);
        }
        let taken = records.length().min(wanted);
        // Oldest first, like the index read.
        let mut values = Vec::with_capacity(taken as usize);
        for at in (0..taken).rev() {
            values.push(field(&records.get(at), "value").map_err(js_store_error)?);
        }
        Ok(Some((values, complete)))
    }

    /// `thread_tail_values` with a few requests in one read-only
    /// transaction: a reverse cursor on `threadTime` skipping to the
    /// `count`-th newest, then one range read from there.
    pub async fn tail_by_cursor(
        &self,
        thread_id: &str,
        count: usize,
    ) -> Result<(Vec<JsValue>, bool), StoreError> {
        let (_tx, index) = self.nodes_index("threadTime").await?;
        let key = |time: f64| thread_time_key(thread_id, time);
        // From `from` (a creation time) to the thread's newest node.
        let since = |from: f64| {
            KeyRange::bound(&key(from), &key(f64::INFINITY), None, None).map_err(store_error)
        };
        let skip = u32::try_from(count.max(1) - 1).unwrap_or(u32::MAX);
        // The `count`-th newest and the one after it: without the second,
        // `count` covers the whole thread.
        let boundary = index
            .scan(
                Some(since(f64::NEG_INFINITY)?),
                Some(2),
                Some(skip),
                Some(Direction::Prev),
            )
            .await
            .map_err(store_error)?;
        let (from, complete) = match boundary.as_slice() {
            [(key, _), _] => match js_sys::Array::from(key).get(1).as_f64() {
                Some(time) => (time, false),
                None => (f64::NEG_INFINITY, true),
            },
            // At most `count` nodes: all of them.
            _ => (f64::NEG_INFINITY, true),
        };
        let values = index
            .get_all(Some(since(from)?), None)
            .await
            .map_err(store_error)?;
        Ok((values, complete))
    }

    /// Decode what `thread_node_values` read (undecodable records are skipped
    /// and reported, never deleted).
    pub fn decode_nodes(values: Vec<JsValue>) -> (Vec<Node>, Skipped) {
        let mut skipped = Vec::new();
        let nodes = decode_node_values(values, &mut skipped);
        (nodes, skipped)
    }

    /// Every record of one store as raw JS values (tests and diagnostics).
    pub async fn dump(&self, store: &str) -> Result<Vec<JsValue>, StoreError> {
        let tx = self
            .rexie()
            .await?
            .transaction(&[store], TransactionMode::ReadOnly)
            .map_err(store_error)?;
        let s = tx.store(store).map_err(store_error)?;
        s.get_all(None, None).await.map_err(store_error)
    }
}

impl IdbStore {
    /// Put a raw JSON record (tests of damaged data).
    pub async fn put_raw_for_tests(&self, store: &str, json: &str) -> Result<(), StoreError> {
        let value =
            js_sys::JSON::parse(json).map_err(|e| store_error(super::error::js_to_error(e)))?;
        self.put_value_for_tests(store, &value).await
    }

    /// Put any JS value as a record of `store` (tests: values that are not
    /// JSON data).
    pub async fn put_value_for_tests(
        &self,
        store: &str,
        value: &JsValue,
    ) -> Result<(), StoreError> {
        let tx = self
            .rexie()
            .await?
            .transaction(&[store], TransactionMode::ReadWrite)
            .map_err(store_error)?;
        tx.store(store)
            .map_err(store_error)?
            .put(value, None)
            .await
            .map_err(store_error)?;
        tx.done().await.map_err(store_error)?;
        Ok(())
    }
}
