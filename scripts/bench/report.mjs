// Output of the benchmark harness: the console table, the Markdown block of
// BENCHMARKS.md and the SVG plot, all generated from results.json's data.
//
// Owns: formatting only. Must not: measure, or depend on any package (the
// SVG is written by hand).

import { round } from './stats.mjs';

const fmt = (value) => {
  if (value === null || value === undefined) return '–';
  if (typeof value === 'boolean') return value ? 'yes' : 'no';
  if (typeof value === 'string') return value;
  if (!Number.isFinite(value)) return String(value);
  const r = round(value);
  return Math.abs(r) >= 10000 ? r.toLocaleString('en-US') : String(r);
};

function spread(figure) {
  if (!figure.n || figure.n < 2) return '';
  return `${fmt(figure.min)}–${fmt(figure.max)}`;
}

/** Rows: [group, label, median, spread, n, unit]. */
export function tableRows(figures) {
  return figures.map((f) => [f.group, f.label, fmt(f.median), spread(f), String(f.n ?? 1), f.unit]);
}

export function consoleTable(figures, targets) {
  const header = ['group', 'figure', 'median', 'min–max', 'n', 'unit'];
  const rows = [header, ...tableRows(figures)];
  const widths = header.map((_, i) => Math.max(...rows.map((r) => r[i].length)));
  const line = (r) => r.map((cell, i) => (i >= 2 && i <= 4 ? cell.padStart(widths[i]) : cell.padEnd(widths[i]))).join('  ');
  const out = [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.slice(1).map(line)];
  out.push('', 'targets (ratios measured in this run):');
  for (const t of targets) {
    out.push(`  ${t.met === true ? 'MET    ' : t.met === false ? 'NOT MET' : 'n/a    '}  ${t.name}: ${fmt(t.measured)} ${t.unit} (target ${t.comparator} ${fmt(t.limit)})${t.note ? ` — ${t.note}` : ''}`);
  }
  return out.join('\n');
}

export function markdownBlock(results) {
  const { figures, targets, machine, git, date } = results;
  const out = [];
  out.push(
    `Measured ${date} on ${machine.cpuModel} (${machine.cores} cores, load average ${machine.loadAverage.start.map((l) => l.toFixed(2)).join(' / ')} at the start), ` +
      `${machine.browser}, Node ${machine.node}, commit \`${git.commit.slice(0, 12)}\`${git.dirty ? ' (with uncommitted changes)' : ''}. ` +
      `Mode: ${results.config.quick ? 'quick' : 'full'}.`,
  );
  out.push('');
  out.push('| target (ratio in one run) | measured | target | met |');
  out.push('|---|---:|---:|:---:|');
  for (const t of targets) {
    out.push(`| ${t.name}${t.note ? ` <br><sub>${t.note}</sub>` : ''} | ${fmt(t.measured)} ${t.unit} | ${t.comparator} ${fmt(t.limit)} | ${t.met === true ? '✅' : t.met === false ? '❌' : '–'} |`);
  }
  out.push('');
  let group = null;
  for (const f of figures) {
    if (f.group !== group) {
      group = f.group;
      out.push('', `**${group}**`, '', '| figure | median | min–max | n | unit |', '|---|---:|---:|---:|---|');
    }
    out.push(`| ${f.label} | ${fmt(f.median)} | ${spread(f)} | ${f.n ?? 1} | ${f.unit} |`);
  }
  if (results.problems.length) {
    out.push('', '**Problems found in this run:**', '');
    for (const p of results.problems) out.push(`- ${p}`);
  }
  return out.join('\n');
}

/** Replaces the text between the bench markers of `doc` with `block`. */
export function replaceBlock(doc, block) {
  const start = '<!-- bench:results:start -->';
  const end = '<!-- bench:results:end -->';
  const i = doc.indexOf(start);
  const j = doc.indexOf(end);
  if (i < 0 || j < i) return null;
  return `${doc.slice(0, i + start.length)}\n${block}\n${doc.slice(j)}`;
}

// ------------------------------------------------------------------ SVG

const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

/**
 * One panel: a log-x line chart of series [{ name, color, dash?, points: [{ x, median, min, max }] }].
 */
function panel({ x0, y0, width, height, title, yLabel, series }) {
  const points = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p.median));
  const xs = points.map((p) => p.x).filter((x) => x > 0);
  const minX = Math.min(...xs);
  const maxX = Math.max(...xs);
  const lx = (x) => Math.log10(Math.max(x, 1));
  const left = 64;
  const bottom = 44;
  const top = 34;
  const right = 16;
  const plotW = width - left - right;
  const plotH = height - top - bottom;
  const top0 = Math.max(...points.map((p) => (Number.isFinite(p.max) ? p.max : p.median)), 1e-9);
  // A round y step (1, 2 or 5 × 10^k) with five or fewer steps up to the top.
  const rawStep = top0 / 5;
  const magnitude = 10 ** Math.floor(Math.log10(rawStep));
  const yStep = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= rawStep);
  const ticks = Math.ceil(top0 / yStep);
  const maxY = yStep * ticks;
  const px = (x) => x0 + left + ((lx(x) - lx(minX)) / Math.max(lx(maxX) - lx(minX), 1e-9)) * plotW;
  const py = (y) => y0 + top + plotH - (y / maxY) * plotH;
  const out = [];
  out.push(`<text x="${x0 + width / 2}" y="${y0 + 20}" text-anchor="middle" font-size="14" font-weight="bold">${esc(title)}</text>`);
  out.push(`<rect x="${x0 + left}" y="${y0 + top}" width="${plotW}" height="${plotH}" fill="none" stroke="#999"/>`);
  // y grid: 5 ticks
  for (let i = 0; i <= ticks; i += 1) {
    const v = yStep * i;
    const y = py(v);
    out.push(`<line x1="${x0 + left}" y1="${y}" x2="${x0 + left + plotW}" y2="${y}" stroke="#eee"/>`);
    out.push(`<text x="${x0 + left - 6}" y="${y + 4}" text-anchor="end" font-size="11">${esc(fmt(v))}</text>`);
  }
  for (const x of [...new Set(xs)].sort((a, b) => a - b)) {
    out.push(`<text x="${px(x)}" y="${y0 + top + plotH + 16}" text-anchor="middle" font-size="11">${esc(x.toLocaleString('en-US'))}</text>`);
  }
  out.push(`<text x="${x0 + left + plotW / 2}" y="${y0 + height - 8}" text-anchor="middle" font-size="12">thread length (nodes, log scale)</text>`);
  out.push(`<text x="${x0 + 14}" y="${y0 + top + plotH / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 ${x0 + 14} ${y0 + top + plotH / 2})">${esc(yLabel)}</text>`);
  series.forEach((s, index) => {
    const pts = s.points.filter((p) => Number.isFinite(p.median)).sort((a, b) => a.x - b.x);
    if (!pts.length) return;
    const d = pts.map((p, i) => `${i ? 'L' : 'M'}${px(p.x).toFixed(1)},${py(p.median).toFixed(1)}`).join(' ');
    out.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="2"${s.dash ? ' stroke-dasharray="6 4"' : ''}/>`);
    for (const p of pts) {
      if (Number.isFinite(p.min) && Number.isFinite(p.max) && p.max > p.min) {
        out.push(`<line x1="${px(p.x)}" y1="${py(p.min)}" x2="${px(p.x)}" y2="${py(p.max)}" stroke="${s.color}" stroke-width="1"/>`);
      }
      out.push(`<circle cx="${px(p.x)}" cy="${py(p.median)}" r="3" fill="${s.color}"/>`);
    }
    const ly = y0 + top + 14 + index * 16;
    out.push(`<line x1="${x0 + left + 10}" y1="${ly - 4}" x2="${x0 + left + 30}" y2="${ly - 4}" stroke="${s.color}" stroke-width="2"${s.dash ? ' stroke-dasharray="6 4"' : ''}/>`);
    out.push(`<text x="${x0 + left + 36}" y="${ly}" font-size="11">${esc(s.name)}</text>`);
  });
  return out.join('\n');
}

/** The plot of BENCHMARKS.md: per-step overhead and cold start against thread length. */
export function plotSvg({ perStep, coldStart, subtitle }) {
  const width = 980;
  const height = 400;
  const body = [
    panel({ x0: 0, y0: 10, width: width / 2, height: height - 30, title: 'Per-step overhead', yLabel: 'ms per step', series: perStep }),
    panel({ x0: width / 2, y0: 10, width: width / 2, height: height - 30, title: 'Cold start: Port connect → initialized', yLabel: 'ms', series: coldStart }),
  ];
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif">`,
    `<rect width="${width}" height="${height}" fill="white"/>`,
    ...body,
    `<text x="${width / 2}" y="${height - 4}" text-anchor="middle" font-size="10" fill="#555">${esc(subtitle)}</text>`,
    '</svg>',
    '',
  ].join('\n');
}
