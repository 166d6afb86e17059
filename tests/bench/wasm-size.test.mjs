// Unit tests of the bench's size attribution (scripts/bench/wasm-size.mjs):
// which crate a function name belongs to, and the shipped module's gzip bytes
// per owner read through a named copy of it. BENCHMARKS.md's size figures
// (and what they say the target would take) rest on both.
// Run: node --test tests/bench/

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { gzipByOwner, ownerOf, parseWasm } from '../../scripts/bench/wasm-size.mjs';

test('owner_of_names_the_crate_of_every_name_form_the_two_builds_carry', () => {
  const cases = [
    // cargo's output: legacy and v0 manglings
    ['_ZN4core3fmt5write17h0123456789abcdefE', 'core'],
    ['_ZN8sw_agent6engine6Engine9handle_op17h0123456789abcdefE', 'sw_agent::engine'],
    ['_ZN104_$LT$serde_json..de..Deserializer$LT$R$GT$$u20$as$u20$serde_core..de..Deserializer$GT$3foo17h0123456789abcdefE', 'serde_json'],
    // wasm-opt's names (demangled, with or without the crate hash)
    ['core[c5930c85a12de822]::num::flt2dec::strategy::dragon::format_shortest', 'core'],
    ['sw_agent::platform::Driver::run_tool::{{closure}}::h87b9ea666fad1cf3', 'sw_agent::platform'],
    ['<sw_agent::model::node_de::NodeVisitor as serde_core::de::Visitor>::visit_map::h3f30', 'sw_agent::model'],
    ['<&mut serde_json::de::Deserializer<R> as serde_core::de::Deserializer>::deserialize_any::h74', 'serde_json'],
    ['<<alloc::vec::drain::Drain<T,A> as core::ops::drop::Drop>::drop::DropGuard<T,A> as core::ops::drop::Drop>::drop', 'alloc'],
    ['<[core::mem::maybe_uninit::MaybeUninit<T>] as core::array::iter::iter_inner::PartialDrop>::partial_drop', 'core'],
    // a primitive or a generic parameter: the trait's crate
    ['<f64 as core[c5930c85a12de822]::fmt::Display>::fmt', 'core'],
    ['<&T as serde_json::value::index::Index>::index_into::h1998', 'serde_json'],
    ['<u64 as itoa::Unsigned>::fmt::h4992', 'itoa'],
    ['<char>::escape_debug_ext', 'core'],
    ['__rustc[b7974e8690430dd9]::__rdl_realloc', 'std'],
    // what wasm-bindgen and the linker add
    ['engine_on_cached_initialize', 'sw_agent::exports'],
    ['engine_start externref shim', 'wasm_bindgen'],
    ['__externref_table_alloc', 'wasm_bindgen'],
    ['__wbg_fetch_db1a5276f484e535', 'wasm_bindgen'],
    ['memcpy', 'std (runtime)'],
    ['__multi3', 'std (runtime)'],
    ['', '(unnamed / other)'],
  ];
  for (const [name, owner] of cases) assert.equal(ownerOf(name), owner, name);
});

// ------------------------------------------------ a module made by hand

const leb = (n) => {
  const out = [];
  do {
    let byte = n & 0x7f;
    n >>>= 7;
    if (n) byte |= 0x80;
    out.push(byte);
  } while (n);
  return out;
};
const bytesOf = (text) => [...Buffer.from(text, 'utf8')];
const vec = (items) => [...leb(items.length), ...items.flat()];
const section = (id, body) => [id, ...leb(body.length), ...body];
const name = (text) => [...leb(Buffer.byteLength(text)), ...bytesOf(text)];

/**
 * A module of `functions` ([name, body size] each: `() -> ()` bodies of
 * `nop`s) and one data segment, with a name section unless `names` is false.
 */
function module(functions, { data = 'some data, some data, some data', names = true } = {}) {
  const body = (size) => {
    const code = [0x00, ...new Array(size).fill(0x01), 0x0b]; // no locals, nops, end
    return [...leb(code.length), ...code];
  };
  const parts = [
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, vec([[0x60, 0x00, 0x00]])),
    ...section(3, vec(functions.map(() => [0x00]))),
    ...section(5, vec([[0x00, 0x01]])),
    ...section(10, vec(functions.map(([, size]) => body(size)))),
    ...section(11, vec([[0x00, 0x41, 0x00, 0x0b, ...name(data)]])),
  ];
  if (names) {
    const map = vec(functions.map(([fn], i) => [...leb(i), ...name(fn)]));
    parts.push(...section(0, [...name('name'), 1, ...leb(map.length), ...map]));
  }
  return Uint8Array.from(parts);
}

test('gzip_by_owner_names_the_shipped_code_through_its_named_copy_and_refuses_another_build', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'wasm-size-'));
  const functions = [
    ['sw_agent::engine::Engine::handle_op', 300],
    ['sw_agent::engine::Engine::new', 100],
    ['core[c5930c85a12de822]::fmt::write', 200],
    ['<f64 as core::fmt::Display>::fmt', 50],
    ['serde_json::de::from_str', 120],
  ];
  const named = path.join(dir, 'named.wasm');
  const shipped = path.join(dir, 'shipped.wasm');
  writeFileSync(named, module(functions));
  writeFileSync(shipped, module(functions, { names: false }));
  assert.ok(new WebAssembly.Module(module(functions)), 'the hand-made module is valid wasm');

  const parsed = parseWasm(module(functions));
  assert.equal(parsed.code.length, 5);
  assert.deepEqual(parsed.bodies, [302, 102, 202, 52, 122]); // `nop`s, the locals count and `end`

  const by = gzipByOwner(named, shipped);
  assert.ok(by, 'the named copy matches the shipped module');
  const owners = Object.fromEntries(by.owners.map((o) => [o.owner, o]));
  assert.deepEqual(Object.keys(owners).sort(), ['core', 'serde_json', 'sw_agent::engine']);
  assert.equal(owners['sw_agent::engine'].functions, 2);
  assert.equal(owners['sw_agent::engine'].raw, 302 + 102);
  assert.equal(owners.core.functions, 2);
  assert.equal(by.totalGzip, gzipSync(module(functions, { names: false }), { level: 9 }).length);
  assert.ok(by.ownGzip > 0 && by.withoutOwn > by.dataGzip, JSON.stringify(by));

  // Another build (a body one byte longer): not attributed at all.
  const other = functions.map(([fn, size], i) => [fn, i === 0 ? size + 1 : size]);
  writeFileSync(shipped, module(other, { names: false }));
  assert.equal(gzipByOwner(named, shipped), null);
  // Nor against a missing file.
  assert.equal(gzipByOwner(path.join(dir, 'none.wasm'), shipped), null);
});
