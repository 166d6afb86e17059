// Where the .wasm bytes go: code size per crate (and per module of sw_agent),
// read from the `name` section of cargo's own output
// (target/wasm32-unknown-unknown/release/sw_agent.wasm, before wasm-bindgen
// and wasm-opt, which drop the names). The shipped binary is smaller, but
// the shares point at what to cut. And the shipped module in the measure the
// target uses (gzip), per owner, read from a copy of the same build that
// keeps its function names (scripts/bench-named-wasm.sh --out).
//
// Owns: a minimal wasm binary reader (sections, code bodies, function names)
// and Rust symbol → crate attribution (legacy `_ZN` and v0 `_R` manglings).
// Must not: depend on any package.

import { existsSync, readFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';

function reader(bytes) {
  let pos = 0;
  const u32 = () => {
    let result = 0;
    let shift = 0;
    for (;;) {
      const byte = bytes[pos++];
      result += (byte & 0x7f) * 2 ** shift;
      if ((byte & 0x80) === 0) return result;
      shift += 7;
    }
  };
  const name = () => {
    const len = u32();
    const text = Buffer.from(bytes.subarray(pos, pos + len)).toString('utf8');
    pos += len;
    return text;
  };
  return {
    u32,
    name,
    byte: () => bytes[pos++],
    get pos() {
      return pos;
    },
    set pos(p) {
      pos = p;
    },
  };
}

/**
 * Parses a module: imported function count, code body sizes (and each body's
 * bytes, in `code`), function names, data bytes, and each section's bytes
 * (`raw`, keyed by id; custom sections are not kept).
 */
export function parseWasm(bytes) {
  const r = reader(bytes);
  r.pos = 8;
  let importedFunctions = 0;
  const bodies = [];
  const code = [];
  const raw = new Map();
  const names = new Map();
  let dataBytes = 0;
  const sections = {};
  while (r.pos < bytes.length) {
    const id = r.byte();
    const size = r.u32();
    const start = r.pos;
    const end = start + size;
    if (id === 2) {
      const count = r.u32();
      for (let i = 0; i < count; i += 1) {
        r.name();
        r.name();
        const kind = r.byte();
        if (kind === 0) {
          r.u32();
          importedFunctions += 1;
        } else if (kind === 1) {
          r.byte();
          const flags = r.u32();
          r.u32();
          if (flags & 1) r.u32();
        } else if (kind === 2) {
          const flags = r.u32();
          r.u32();
          if (flags & 1) r.u32();
        } else if (kind === 3) {
          r.byte();
          r.byte();
        } else {
          break; // unknown import kind: names are still usable
        }
      }
    } else if (id === 10) {
      const count = r.u32();
      for (let i = 0; i < count; i += 1) {
        const bodySize = r.u32();
        bodies.push(bodySize);
        code.push(bytes.subarray(r.pos, r.pos + bodySize));
        r.pos += bodySize;
      }
    } else if (id === 11) {
      dataBytes += size;
    } else if (id === 0) {
      const sectionName = r.name();
      if (sectionName === 'name') {
        while (r.pos < end) {
          const sub = r.byte();
          const subSize = r.u32();
          const subEnd = r.pos + subSize;
          if (sub === 1) {
            const count = r.u32();
            for (let i = 0; i < count; i += 1) {
              const index = r.u32();
              names.set(index, r.name());
            }
          }
          r.pos = subEnd;
        }
      }
      sections[`custom:${sectionName}`] = (sections[`custom:${sectionName}`] ?? 0) + size;
    }
    sections[id] = (sections[id] ?? 0) + size;
    if (id !== 0) raw.set(id, bytes.subarray(start, end));
    r.pos = end;
  }
  return { importedFunctions, bodies, code, names, dataBytes, sections, raw };
}

/**
 * The path a demangled name (wasm-opt's names: `core[5d2c…]::fmt::write`,
 * `<&mut serde_json::de::Deserializer<R> as serde_core::…>::…`) starts with:
 * the implementing type's, or, when that type is a primitive or a generic
 * parameter (`<f64 as core::fmt::Display>::fmt`, `<T as alloc::…>`), the
 * trait's; an inherent method of a primitive (`<str>::lines`) is core's.
 */
function demangledPath(symbol) {
  const s = symbol.replace(/\[[0-9a-f]{8,}\]/g, '').replace(/^__rustc::/, 'std::');
  const start = /^(?:<|&|mut |\*const |\*mut |dyn |\[)*/.exec(s)[0].length;
  const rest = s.slice(start);
  const head = /^[A-Za-z_][A-Za-z0-9_]*/.exec(rest)?.[0] ?? '';
  if (rest.startsWith(`${head}::`)) return rest.split('::');
  const trait = / as (?:&|mut |dyn )*([A-Za-z_][A-Za-z0-9_]*)::/.exec(rest);
  return trait ? [trait[1]] : ['core'];
}

/** Crate (and, for sw_agent, module) that a mangled or demangled Rust symbol belongs to. */
export function ownerOf(symbol, ownCrate = 'sw_agent') {
  let path = null;
  if (symbol.startsWith('_ZN')) {
    path = [];
    let i = 3;
    while (i < symbol.length && /\d/.test(symbol[i]) && path.length < 3) {
      let j = i;
      while (/\d/.test(symbol[j])) j += 1;
      const len = Number(symbol.slice(i, j));
      path.push(symbol.slice(j, j + len));
      i = j + len;
    }
  } else if (symbol.startsWith('_R')) {
    const match = /C(?:s[0-9A-Za-z]*_)?(\d+)(_?[A-Za-z][A-Za-z0-9_]*)/.exec(symbol);
    if (match) {
      const name = match[2].slice(0, Number(match[1]));
      path = [name.replace(/^_/, '')];
      const rest = symbol.slice(match.index + match[0].length - match[2].length + Number(match[1]));
      const next = /^(\d+)([A-Za-z_][A-Za-z0-9_]*)/.exec(rest);
      if (next) path.push(next[2].slice(0, Number(next[1])));
    }
  } else if (symbol.includes('::')) {
    path = demangledPath(symbol);
  }
  if (!path || path.length === 0) {
    if (/^__wbindgen|^__wbg|wasm_bindgen|^__externref| shim$/.test(symbol)) return 'wasm_bindgen';
    // The exports wasm-bindgen generates for the crate's API (`engine_start`).
    if (/^[a-z][a-z0-9]*_[a-z0-9_]+$/.test(symbol)) return `${ownCrate}::exports`;
    return /^(memcpy|memset|memmove|memcmp|dlmalloc|__rust|rust_|__[a-z]+\d$|round$|floor$|ceil$|trunc$|fmod$)/.test(symbol) ? 'std (runtime)' : '(unnamed / other)';
  }
  if (path[0].replace(/^_/, '').startsWith('$LT$')) {
    // `<Type as Trait>::method` (legacy mangling): the implementing type's crate.
    const decoded = path[0].replace(/^_/, '')
      .replace(/\$LT\$/g, '<')
      .replace(/\$GT\$/g, '>')
      .replace(/\$u20\$/g, ' ')
      .replace(/\$RF\$/g, '&')
      .replace(/\$BP\$/g, '*')
      .replace(/\$C\$/g, ',')
      .replace(/\$u5b\$/g, '[')
      .replace(/\$u5d\$/g, ']')
      .replace(/\.\./g, '::');
    const type = /^<[&*\[\s]*(?:mut |const |dyn )?([A-Za-z_][A-Za-z0-9_]*)(?:::([A-Za-z_][A-Za-z0-9_]*))?/.exec(decoded);
    if (type) path = [type[1], type[2]].filter(Boolean);
  }
  const crate = path[0].replace(/^_/, '');
  if (crate === ownCrate && path[1]) return `${ownCrate}::${path[1]}`;
  return crate;
}

/** Code bytes per owner, largest first: [{ owner, bytes, share }], plus totals. */
export function sizeByCrate(file) {
  if (!existsSync(file)) return null;
  const parsed = parseWasm(readFileSync(file));
  const totals = new Map();
  let code = 0;
  parsed.bodies.forEach((size, i) => {
    const name = parsed.names.get(parsed.importedFunctions + i) ?? '';
    const owner = ownerOf(name);
    totals.set(owner, (totals.get(owner) ?? 0) + size);
    code += size;
  });
  const owners = [...totals.entries()]
    .map(([owner, bytes]) => ({ owner, bytes, share: bytes / code }))
    .sort((a, b) => b.bytes - a.bytes);
  return { file, codeBytes: code, dataBytes: parsed.dataBytes, functions: parsed.bodies.length, named: parsed.names.size, owners };
}

const gzipBytes = (parts) => gzipSync(Buffer.concat(parts), { level: 9 }).length;

/**
 * The shipped module in the target's measure: gzip -9 bytes of its code per
 * owner, of its data section and of everything else, read from `named` (the
 * same build with a name section: scripts/bench-named-wasm.sh --out), which
 * must have exactly the shipped module's code and data (`shipped`; null if
 * not, or if either file is missing).
 *
 * gzip is not additive: `owners[].gzip` compresses each owner's functions
 * alone (their sum is a little over `codeGzip`, which compresses all code
 * at once). `withoutOwn` is what would be left of the module with none of
 * sw_agent's own functions, everything else as this build has it: the
 * libraries as the engine instantiates them, the data, the other sections.
 */
export function gzipByOwner(named, shipped, ownCrate = 'sw_agent') {
  if (!existsSync(named) || !existsSync(shipped)) return null;
  const n = parseWasm(readFileSync(named));
  const s = parseWasm(readFileSync(shipped));
  const same = (id) => Buffer.compare(Buffer.from(n.raw.get(id) ?? []), Buffer.from(s.raw.get(id) ?? [])) === 0;
  if (!same(10) || !same(11)) return null;
  const groups = new Map();
  n.code.forEach((body, i) => {
    const owner = ownerOf(n.names.get(n.importedFunctions + i) ?? '', ownCrate);
    const group = groups.get(owner) ?? { owner, functions: 0, raw: 0, parts: [] };
    group.functions += 1;
    group.raw += body.length;
    group.parts.push(body);
    groups.set(owner, group);
  });
  const owners = [...groups.values()]
    .map(({ parts, ...g }) => ({ ...g, gzip: gzipBytes(parts) }))
    .sort((a, b) => b.gzip - a.gzip);
  const own = (o) => o.owner === ownCrate || o.owner.startsWith(`${ownCrate}::`);
  const others = [...s.raw.entries()].filter(([id]) => id !== 10 && id !== 11).map(([, b]) => b);
  const libraryCode = [...groups.values()].filter((g) => !own(g)).flatMap((g) => g.parts);
  const dataGzip = gzipBytes([s.raw.get(11) ?? Buffer.alloc(0)]);
  const otherGzip = gzipBytes(others);
  return {
    totalGzip: gzipSync(readFileSync(shipped), { level: 9 }).length,
    codeGzip: gzipBytes(s.code),
    dataRaw: (s.raw.get(11) ?? []).length,
    dataGzip,
    otherGzip,
    ownGzip: gzipBytes([...groups.values()].filter(own).flatMap((g) => g.parts)),
    withoutOwn: gzipBytes(libraryCode) + dataGzip + otherGzip,
    owners,
  };
}
