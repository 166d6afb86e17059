// Where the .wasm bytes go: code size per crate (and per module of sw_agent),
// read from the `name` section of cargo's own output
// (target/wasm32-unknown-unknown/release/sw_agent.wasm, before wasm-bindgen
// and wasm-opt, which drop the names). The shipped binary is smaller, but
// the shares point at what to cut.
//
// Owns: a minimal wasm binary reader (sections, code bodies, function names)
// and Rust symbol → crate attribution (legacy `_ZN` and v0 `_R` manglings).
// Must not: depend on any package.

import { existsSync, readFileSync } from 'node:fs';

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

/** Parses a module: imported function count, code body sizes, function names, data bytes. */
export function parseWasm(bytes) {
  const r = reader(bytes);
  r.pos = 8;
  let importedFunctions = 0;
  const bodies = [];
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
    r.pos = end;
  }
  return { importedFunctions, bodies, names, dataBytes, sections };
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
    path = symbol.replace(/^</, '').split('::');
  }
  if (!path || path.length === 0) {
    if (/^__wbindgen|^__wbg|wasm_bindgen/.test(symbol)) return 'wasm_bindgen';
    return /^(memcpy|memset|memmove|memcmp|dlmalloc|__rust|rust_)/.test(symbol) ? 'std (runtime)' : '(unnamed / other)';
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
