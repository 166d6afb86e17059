// Parses the extension's JavaScript before a build ships it: a syntax error
// in a module the service worker imports (sw.js and the embedding
// extension's host-tools.js, settings-defaults.js, instructions.js,
// mcp-servers.js) stops
// the worker before a line of it runs, and Chrome says so only on its
// extensions page. Modules are the top-level files of the directory;
// content/ holds classic scripts injected into pages.
//
//   node scripts/check-js.mjs [dir]     (default: extension)
//
// Exit status 1, and each error with its file and line, when one does not parse.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The files of `dir` that do not parse: [{ file, message }].
 * @param {string} dir
 */
export function syntaxErrors(dir) {
  const scripts = (sub, type) =>
    existsSync(path.join(dir, sub))
      ? readdirSync(path.join(dir, sub))
          .filter((name) => name.endsWith('.js'))
          .sort()
          .map((name) => ({ file: path.join(dir, sub, name), type }))
      : [];
  const errors = [];
  for (const { file, type } of [...scripts('.', 'module'), ...scripts('content', 'commonjs')]) {
    // From stdin, so that the kind of script is this one whatever package.json says.
    const run = spawnSync(process.execPath, ['--check', `--input-type=${type}`], {
      input: readFileSync(file),
      encoding: 'utf8',
    });
    if (run.status !== 0) {
      const message = run.stderr
        .split('\n')
        .filter((line) => line.trim() !== '' && !/^\s+at |^Node\.js v/.test(line))
        .join('\n')
        .replaceAll('[stdin]', path.normalize(file));
      errors.push({ file: path.normalize(file), message });
    }
  }
  return errors;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const dir = process.argv[2] ?? 'extension';
  const errors = syntaxErrors(dir);
  for (const { file, message } of errors) {
    console.error(`${file} does not parse; the service worker would not start:\n${message}\n`);
  }
  process.exit(errors.length === 0 ? 0 : 1);
}
