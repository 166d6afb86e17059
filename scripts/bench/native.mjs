// The native half of `make bench`: runs the criterion benches
// (benches/native.rs) and reads their results back from target/criterion.
//
// Owns: turning criterion's per-sample times into figures with units
// (MB/s for byte throughput, steps/s for the simulation, ms per call).
// Must not: read results older than the run it started.

import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { summarize } from './stats.mjs';

/** Runs `cargo bench --bench native` (extra args go to criterion, e.g. --quick). Throws on failure. */
export function runCriterion(repoRoot, extraArgs = []) {
  const args = ['bench', '--bench', 'native', '--', ...extraArgs];
  process.stderr.write(`bench: cargo ${args.join(' ')}\n`);
  const result = spawnSync('cargo', args, { cwd: repoRoot, stdio: ['ignore', 'inherit', 'inherit'] });
  if (result.status !== 0) throw new Error(`cargo bench failed (exit ${result.status})`);
}

function* benchDirs(dir) {
  if (!existsSync(dir)) return;
  for (const entry of readdirSync(dir)) {
    const full = path.join(dir, entry);
    if (!statSync(full).isDirectory()) continue;
    if (entry === 'new' && existsSync(path.join(full, 'benchmark.json'))) yield full;
    else if (entry !== 'base' && entry !== 'report' && entry !== 'change') yield* benchDirs(full);
  }
}

/**
 * Reads every criterion result written at or after `sinceMs`.
 * @returns {{ id, throughput, perIterationNs: object, median: object }[]}
 */
export function readCriterion(repoRoot, sinceMs = 0) {
  const out = [];
  for (const dir of benchDirs(path.join(repoRoot, 'target', 'criterion'))) {
    const estimatesPath = path.join(dir, 'estimates.json');
    if (!existsSync(estimatesPath) || statSync(estimatesPath).mtimeMs < sinceMs) continue;
    const benchmark = JSON.parse(readFileSync(path.join(dir, 'benchmark.json'), 'utf8'));
    const estimates = JSON.parse(readFileSync(estimatesPath, 'utf8'));
    const sample = JSON.parse(readFileSync(path.join(dir, 'sample.json'), 'utf8'));
    const perIteration = sample.times.map((t, i) => t / sample.iters[i]);
    out.push({
      id: benchmark.full_id,
      throughput: benchmark.throughput ?? null,
      perIterationNs: summarize(perIteration),
      medianNs: estimates.median.point_estimate,
      medianCiNs: [estimates.median.confidence_interval.lower_bound, estimates.median.confidence_interval.upper_bound],
      samples: perIteration.length,
    });
  }
  return out.sort((a, b) => a.id.localeCompare(b.id));
}

/**
 * Figures for results.json from criterion results. Spread = the fastest and
 * slowest sample (each sample is the mean of many iterations).
 */
export function nativeFigures(results) {
  const figures = [];
  for (const r of results) {
    const s = r.perIterationNs;
    const inverse = (k) => ({ median: k / s.median, min: k / s.max, max: k / s.min });
    const base = { group: 'native (criterion, release profile)', id: `native.${r.id.replaceAll('/', '.')}`, n: r.samples, source: 'criterion' };
    if (r.throughput?.Bytes) {
      const mb = r.throughput.Bytes / 1e6;
      figures.push({ ...base, label: `${r.id} throughput`, unit: 'MB/s', ...inverse(mb * 1e9) });
    } else if (r.id.startsWith('sim/') && r.throughput?.Elements) {
      figures.push({ ...base, id: `${base.id}.steps_per_s`, label: `${r.id}: steps per second`, unit: 'steps/s', ...inverse(r.throughput.Elements * 1e9) });
      figures.push({
        ...base,
        id: `${base.id}.ms_per_step`,
        label: `${r.id}: time per step`,
        unit: 'ms',
        median: s.median / r.throughput.Elements / 1e6,
        min: s.min / r.throughput.Elements / 1e6,
        max: s.max / r.throughput.Elements / 1e6,
      });
    } else {
      figures.push({ ...base, label: `${r.id}: time per call`, unit: 'ms', median: s.median / 1e6, min: s.min / 1e6, max: s.max / 1e6 });
    }
  }
  return figures;
}
