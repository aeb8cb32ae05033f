// nlagg dashboard, epoch store: the output of every epoch, and per node the epochs it was exposed in
// (red) and every later one (pink: known since, cumulative exposure). Drawn from the snapshot's
// "epochs" field (adversary/reporting/dashboard/epochs.py); app.js calls drawEpochs on every event.
"use strict";

function epochSvg(tag, attrs, parent) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  parent.appendChild(e);
  return e;
}

// eslint-disable-next-line no-unused-vars
function drawEpochs(doc, live) {
  const panel = document.getElementById("epochs-panel");
  panel.hidden = false;
  const series = doc.series;
  const first = doc.cumulative;
  const known = Object.keys(first).length;
  document.getElementById("epochs-note").textContent =
    `${series.length} epoch(s), live: ${live === null ? "none yet" : live}; ` +
    `${known} of ${doc.n} node(s) exposed in at least one epoch`;
  const W = 1000, L = 52, R = 8;
  const k0 = series.length ? series[0].epoch : 0;
  const k1 = series.length ? series[series.length - 1].epoch : 1;
  const X = (k) => L + ((W - L - R) * (k - k0 + 0.5)) / Math.max(1, k1 - k0 + 1);
  const cell = (W - L - R) / Math.max(1, k1 - k0 + 1);
  drawOutputs(series, live, X, cell);
  drawExposures(series, first, doc.n, live, X, cell);
}

function drawOutputs(series, live, X, cell) {
  const svg = document.getElementById("epoch-output");
  svg.replaceChildren();
  const H = 160, T = 8, B = 20;
  const vals = [];
  for (const e of series) for (const v of [e.output, e.published]) if (v !== null) vals.push(v);
  if (!vals.length) return;
  let lo = Math.min(...vals), hi = Math.max(...vals);
  const pad = 0.1 * Math.max(hi - lo, 1e-6 * Math.max(1, Math.abs(hi)));
  lo -= pad; hi += pad;
  const Y = (v) => T + ((H - T - B) * (hi - v)) / (hi - lo);
  for (const e of series) if (e.epoch === live) epochSvg("rect", { class: "live", x: X(e.epoch) - cell / 2, y: T, width: cell, height: H - T - B }, svg);
  for (let i = 0; i <= 2; i++) {
    const v = lo + ((hi - lo) * i) / 2;
    epochSvg("line", { class: "grid", x1: 52, x2: 992, y1: Y(v), y2: Y(v) }, svg);
    epochSvg("text", { x: 2, y: Y(v) + 4 }, svg).textContent = String(Number(v.toPrecision(4)));
  }
  for (const [key, cls] of [["output", "output"], ["published", "published"]]) {
    const pts = series.filter((e) => e[key] !== null).map((e) => `${X(e.epoch).toFixed(1)},${Y(e[key]).toFixed(1)}`);
    if (pts.length) epochSvg("polyline", { class: cls, points: pts.join(" ") }, svg);
  }
  const step = Math.max(1, Math.ceil(series.length / 10));
  series.forEach((e, j) => {
    if (j % step === 0) epochSvg("text", { x: X(e.epoch), y: H - 4, "text-anchor": "middle" }, svg).textContent = `e${e.epoch}`;
  });
}

function drawExposures(series, first, n, live, X, cell) {
  const svg = document.getElementById("epoch-exposure");
  svg.replaceChildren();
  const H = Math.max(60, Math.min(600, 14 * n)), T = 2, B = 2;  // about one 14 px row per node
  svg.setAttribute("viewBox", `0 0 1000 ${H}`);
  svg.style.height = `${H}px`;
  const row = (H - T - B) / Math.max(1, n);
  for (const e of series) if (e.epoch === live) epochSvg("rect", { class: "live", x: X(e.epoch) - cell / 2, y: 0, width: cell, height: H }, svg);
  for (let i = 0; i < n; i++) {
    const since = first[String(i)];
    if (since === undefined) continue;
    for (const e of series) {
      if (e.epoch < since) continue;
      const now = e.exposed.includes(i);
      const r = epochSvg("rect", { class: now ? "exposed" : "known", x: X(e.epoch) - cell / 2, y: T + i * row, width: cell, height: row }, svg);
      epochSvg("title", {}, r).textContent = `node ${i}: ${now ? "exposed in" : "known since epoch " + since + ", not exposed in"} epoch ${e.epoch}`;
    }
  }
  if (n <= 40) for (let i = 0; i < n; i++) epochSvg("text", { x: 2, y: T + (i + 0.75) * row }, svg).textContent = `node ${i}`;
}
