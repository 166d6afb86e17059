// Command-line options of the bench scripts: `--name value` pairs.

/** The value after `--name` in this process's arguments, or `fallback`. */
export function option(name, fallback) {
  const args = process.argv.slice(2);
  const at = args.indexOf(name);
  return at >= 0 ? args[at + 1] : fallback;
}
