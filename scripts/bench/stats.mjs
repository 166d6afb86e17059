// Small statistics for the benchmark harness: medians and spread.
//
// Owns: summarizing repeated samples (median, min, max, p10, p90, mean) and
// combining them into ratios. Must not: drop samples silently or assume a
// distribution (these machines are noisy; medians and ranges only).

/** Linear-interpolated quantile of an ascending array (q in [0, 1]). */
export function quantile(sorted, q) {
  if (sorted.length === 0) return NaN;
  const position = (sorted.length - 1) * q;
  const low = Math.floor(position);
  const high = Math.ceil(position);
  return sorted[low] + (sorted[high] - sorted[low]) * (position - low);
}

/** { n, median, min, max, p10, p90, mean } of finite samples (NaN fields when empty). */
export function summarize(samples) {
  const values = samples.filter((v) => Number.isFinite(v));
  const sorted = [...values].sort((a, b) => a - b);
  const n = sorted.length;
  return {
    n,
    median: quantile(sorted, 0.5),
    min: n ? sorted[0] : NaN,
    max: n ? sorted[n - 1] : NaN,
    p10: quantile(sorted, 0.1),
    p90: quantile(sorted, 0.9),
    mean: n ? values.reduce((a, b) => a + b, 0) / n : NaN,
  };
}

export function median(samples) {
  return summarize(samples).median;
}

/** Rounds for display and JSON: 3 significant digits below 100, integers above. */
export function round(value) {
  if (!Number.isFinite(value)) return value;
  const abs = Math.abs(value);
  if (abs >= 100) return Math.round(value);
  if (abs >= 10) return Math.round(value * 10) / 10;
  if (abs >= 1) return Math.round(value * 100) / 100;
  if (abs === 0) return 0;
  const digits = 2 - Math.floor(Math.log10(abs));
  const factor = 10 ** Math.min(digits, 9);
  return Math.round(value * factor) / factor;
}

/**
 * A turn's per-step figures from the engine's metrics (`Engine.metrics()`)
 * and its wall time: a step is one provider request. The per-step overhead
 * of the targets is `engineAndCommit` (the engine's own time and its
 * commits, no provider or tool time).
 */
export function perStepOf(metrics, wallMs) {
  const steps = metrics.provider.count;
  return {
    steps,
    engineAndCommit: (metrics.engine.totalMs + metrics.commits.totalMs) / steps,
    provider: metrics.provider.totalMs / steps,
    wallPerStep: wallMs / steps,
  };
}
