// The manifest a build ships: extension/manifest.json with the build's id
// in `version_name` (extension/wasm-cache.js caches the module under it, so
// a cached module only ever meets the glue of its own build), checked for
// what the worker cannot start without, and without the `identity`
// permission when the module has no MCP client (the permission is asked for
// only to sign in to MCP servers: chrome.identity.launchWebAuthFlow; a
// build without the cargo feature `mcp` never calls it, and Chrome shows
// users every permission an extension holds).
//
//   node scripts/built-manifest.mjs MANIFEST BUILD_ID FEATURES
//
// FEATURES is wasm-pack.toml's build.features as the build scripts read it
// (scripts/wasm_pack_config.py's WP_BUILD_FEATURES): "default", or the
// space-separated list ("" for none). Rewrites MANIFEST in place; exit
// status 1, with the reason, when it cannot ship.
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * Whether the module is built with the MCP client: the crate's default
 * features include `mcp` (Cargo.toml).
 * @param {string} features
 */
export function hasMcp(features) {
  const list = features.trim();
  return list === 'default' || list.split(/\s+/).includes('mcp');
}

/**
 * The shipped manifest, or the reasons it cannot ship.
 * @param {any} manifest  extension/manifest.json, parsed
 * @param {{ buildId: string, mcp: boolean }} build
 * @returns {{ manifest: any, problems: string[] }}
 */
export function builtManifest(manifest, { buildId, mcp }) {
  const problems = [];
  if (manifest?.manifest_version !== 3) problems.push('manifest_version must be 3');
  if (manifest?.background?.type !== 'module') problems.push('the service worker must be a module');
  if (!/wasm-unsafe-eval/.test(manifest?.content_security_policy?.extension_pages ?? '')) {
    problems.push('the CSP of extension pages needs wasm-unsafe-eval');
  }
  if (problems.length > 0) return { manifest, problems };
  const built = { ...manifest, version_name: `${manifest.version} (wasm ${buildId})` };
  if (!mcp && Array.isArray(manifest.permissions)) {
    built.permissions = manifest.permissions.filter((p) => p !== 'identity');
  }
  return { manifest: built, problems };
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const [file, buildId, features] = process.argv.slice(2);
  if (!file || !buildId || features === undefined) {
    console.error('usage: node scripts/built-manifest.mjs MANIFEST BUILD_ID FEATURES');
    process.exit(2);
  }
  const { manifest, problems } = builtManifest(JSON.parse(readFileSync(file, 'utf8')), {
    buildId,
    mcp: hasMcp(features),
  });
  for (const problem of problems) console.error(`manifest: ${problem}`);
  if (problems.length > 0) process.exit(1);
  writeFileSync(file, JSON.stringify(manifest, null, 2) + '\n');
}
