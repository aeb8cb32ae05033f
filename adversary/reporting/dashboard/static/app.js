// nlagg dashboard: a read-only view of what the eavesdropper learns, fed by /api/events (SSE).
// Plain SVG, no dependencies. State machine: a "snapshot" event replaces everything, a "delta"
// appends new trajectory columns and exposures and replaces the node states. The slider shows an
// earlier iteration by asking /api/at?t=K (the attack on the transcript cut there).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
const S = {
  cfg: null, positions: [], edges: [], columns: [], exposures: [], nodes: [], latest: -1,
  shown: -1, follow: true, finished: false, verdicts: null, truth: false, output: null, seq: 0,
};

function el(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (parent) parent.appendChild(e);
  return e;
}
// Six significant digits without trailing zeros, in the mantissa of an exponent form too.
const fmt = (v) => {
  if (v === null || v === undefined) return "–";
  const [mant, exp] = Number(v).toPrecision(6).split("e");
  const m = mant.includes(".") ? mant.replace(/\.?0+$/, "") : mant;
  return exp === undefined ? m : `${m}e${exp}`;
};
// An axis tick: rounding residue of the span's arithmetic reads 0, and a label fits the margin.
const tickLabel = (v, span) => {
  if (Math.abs(v) <= 1e-9 * span) return "0";
  const s = String(Number(v.toPrecision(3)));
  return s.length <= 7 ? s : v.toExponential(1);
};

function onSnapshot(doc) {
  S.cfg = doc.config || null;
  S.positions = doc.positions || [];
  S.edges = doc.edges || [];
  S.columns = [];
  S.exposures = [];
  drawGraph();
  onDelta(doc);
}

function onDelta(doc) {
  if (doc.columns) S.columns.length = doc.columns_from, S.columns.push(...doc.columns);
  if (doc.exposures) S.exposures.length = doc.exposures_from, S.exposures.push(...doc.exposures);
  S.latest = doc.t;
  S.finished = doc.finished;
  S.verdicts = doc.verdicts || null;
  S.truth = !!doc.truth;
  S.output = doc.output;
  document.body.dataset.finished = String(!!doc.finished);
  if (doc.epochs) drawEpochs(doc.epochs, doc.epoch);
  header(doc);
  const slider = $("slider");
  slider.max = String(Math.max(0, S.latest));
  slider.disabled = S.latest < 0;
  if (S.follow) {
    slider.value = String(Math.max(0, S.latest));
    show(S.latest, doc.nodes || []);
  } else {
    drawTraj();
    drawTimeline();
  }
  drawLeakage();
}

function header(doc) {
  const c = S.cfg;
  const cap = c ? (doc.early_stop ? `at most ${c.t_total}` : `${c.t_total}`) : "?";
  $("run").textContent = c
    ? `run ${doc.run_id}: ${c.op} on ${c.n} nodes (${c.graph}, ${S.edges.length} edges), ` +
      `${c.phases.length} phase(s), ${cap} iterations` + (S.output !== null ? `; output ${fmt(S.output)}` : "")
    : `run ${doc.run_id}: waiting for the public config`;
  const state = !doc.finished
    ? "live"
    : doc.ran !== null && c && doc.ran < c.t_total
      ? `finished · stopped early, once the network had converged: ${doc.ran} of at most ${c.t_total} iterations run`
      : "finished";
  $("counters").textContent =
    `${state} · ${doc.messages.toLocaleString()} messages captured (${doc.rejected} rejected) · ` +
    `iteration ${doc.t + 1} of ${cap} complete · ${doc.done}/${c ? c.n : "?"} nodes done · ` +
    `${S.exposures.length} honest node(s) exposed`;
}

// The iteration shown and every node's state at it.
function show(t, nodes) {
  S.shown = t;
  S.nodes = nodes;
  document.body.dataset.t = String(t);
  $("slider-out").value = t < 0 ? "–" : `t = ${t}` + (t === S.latest ? " (latest)" : "");
  $("live-btn").disabled = S.follow;
  for (const v of nodes) {
    const c = document.querySelector(`#graph circle[data-node="${v.node}"]`);
    if (!c) continue;
    c.dataset.state = v.state;
    c.dataset.unavoidable = String(!!v.unavoidable);
    for (const k of ["value", "lower", "upper"]) {
      if (v[k] !== undefined && v[k] !== null) c.dataset[k] = String(v[k]); else delete c.dataset[k];
    }
    if (v.t !== undefined) c.dataset.exposedT = String(v.t); else delete c.dataset.exposedT;
    c.querySelector("title").textContent = describe(v);
  }
  drawTraj();
  drawTimeline();
}

function describe(v) {
  let what = "nothing learned";
  if (v.state === "corrupted") what = `corrupted: forwards s = ${fmt(v.value)}`;
  else if (v.state === "exposed") what = `exposed at t = ${v.t}: s = ${fmt(v.value)}` + (v.unavoidable ? " (holds the output: the ideal world exposes it too)" : "");
  else if (v.state === "interval") what = `interval: ${v.lower === null ? "-∞" : fmt(v.lower)} ≤ s ≤ ${v.upper === null ? "∞" : fmt(v.upper)}`;
  return `node ${v.node} (${v.run}${v.branch ? ", branch " + v.branch : ""}): ${what}`;
}

function drawGraph() {
  const g = $("graph");
  g.replaceChildren();
  const r = Math.max(0.008, Math.min(0.03, 0.25 / Math.sqrt(Math.max(1, S.positions.length))));
  const P = S.positions;
  for (const [a, b] of S.edges) el("line", { x1: P[a][0], y1: P[a][1], x2: P[b][0], y2: P[b][1] }, g);
  P.forEach((p, i) => {
    const c = el("circle", { cx: p[0], cy: p[1], r, "data-node": i, "data-state": "honest", tabindex: 0 }, g);
    el("title", {}, c).textContent = `node ${i}`;
    const pick = () => {
      document.querySelectorAll("#graph circle.sel").forEach((x) => x.classList.remove("sel"));
      c.classList.add("sel");
      $("node-info").textContent = c.querySelector("title").textContent;
    };
    c.addEventListener("mouseenter", pick);
    c.addEventListener("focus", pick);
    c.addEventListener("click", pick);
    if (P.length <= 40) {
      const label = el("text", { x: p[0], y: p[1] + r * 0.35 }, g);
      label.setAttribute("font-size", String(r * 1.1));
      label.textContent = String(i);
    }
  });
  $("graph-note").textContent = P.length ? `${P.length} nodes, spring layout of the public edge list` : "";
}

function nodeColor(i) {
  const v = S.nodes[i];
  if (!v) return "#9aa5b1";
  return { exposed: "#e5484d", corrupted: "#f59e0b", interval: "#3b82f6" }[v.state] || "#9aa5b1";
}

// A round number near v (1, 2 or 5 times a power of ten) for axis ticks.
function niceTick(v) {
  if (v <= 0) return 0;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).reduce((a, b) => (Math.abs(b - v) < Math.abs(a - v) ? b : a));
}

function drawTraj() {
  const svg = $("traj");
  svg.replaceChildren();
  if (!S.cfg || !S.columns.length) return;
  const W = 800, H = 420, L = 52, B = 22, T = 8, R = 8;
  const ts = S.cfg.sample_t.slice(0, S.columns.length);
  const tmax = Math.max(1, S.cfg.t_total - 1);
  const vals = [];
  for (const col of S.columns) for (const v of col) if (v !== null) vals.push(v);
  if (!vals.length) return;
  vals.sort((a, b) => a - b);
  let lo = vals[Math.floor(0.01 * (vals.length - 1))], hi = vals[Math.ceil(0.99 * (vals.length - 1))];
  const pad = 0.15 * Math.max(hi - lo, 1e-6);
  lo -= pad; hi += pad;
  const X = (t) => L + ((W - L - R) * t) / tmax;
  const Y = (v) => T + ((H - T - B) * (hi - Math.min(hi, Math.max(lo, v)))) / (hi - lo);
  for (let k = 0; k <= 4; k++) {
    const v = lo + ((hi - lo) * k) / 4;
    el("line", { class: "grid", x1: L, x2: W - R, y1: Y(v), y2: Y(v) }, svg);
    el("text", { x: 2, y: Y(v) + 4 }, svg).textContent = tickLabel(v, hi - lo);
    const t = k === 4 ? tmax : niceTick((tmax * k) / 4);
    const label = el("text", { x: X(t), y: H - 6, "text-anchor": k === 0 ? "start" : k === 4 ? "end" : "middle" }, svg);
    label.textContent = `t=${t}`;
  }
  el("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }, svg);
  el("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }, svg);
  const n = S.columns[0].length;
  const order = [...Array(n).keys()].sort((a, b) => (S.nodes[a]?.state === "honest") - (S.nodes[b]?.state === "honest")).reverse();
  for (const i of order) {
    let pts = "";
    S.columns.forEach((col, k) => { if (col[i] !== null) pts += `${X(ts[k]).toFixed(1)},${Y(col[i]).toFixed(1)} `; });
    const honest = !S.nodes[i] || S.nodes[i].state === "honest";
    el("polyline", { points: pts, stroke: nodeColor(i), "stroke-opacity": honest ? 0.35 : 0.9 }, svg);
  }
  for (const e of S.exposures) {
    if (e.t > S.shown) continue;
    const x = X(e.t), y = Y(e.value);
    el("line", { class: "mark", x1: x - 4, x2: x + 4, y1: y - 4, y2: y + 4 }, svg);
    el("line", { class: "mark", x1: x - 4, x2: x + 4, y1: y + 4, y2: y - 4 }, svg);
  }
  if (S.shown >= 0) el("line", { class: "cursor", x1: X(S.shown), x2: X(S.shown), y1: T, y2: H - B }, svg);
  const step = ts.length > 1 ? ts[1] - ts[0] : 1;
  $("traj-note").textContent = `${n} nodes, every ${step === 1 ? "" : step + "th "}iteration (${ts.length} points each); × = exposure`;
}

function drawTimeline() {
  const svg = $("timeline");
  svg.replaceChildren();
  const list = $("exposure-list");
  list.replaceChildren();
  if (!S.cfg) return;
  const W = 1000, tmax = Math.max(1, S.cfg.t_total - 1);
  const X = (t) => 10 + ((W - 20) * t) / tmax;
  el("line", { class: "grid", x1: 10, x2: W - 10, y1: 50, y2: 50 }, svg).setAttribute("stroke", "#999");
  let start = 0;
  for (const [name, len] of S.cfg.phases) {
    el("text", { x: X(start) + 2, y: 66 }, svg).textContent = `${name} (t=${start})`;
    start += len;
  }
  for (const e of S.exposures) {
    const later = e.t > S.shown;
    const tick = el("line", { class: "tick" + (later ? " later" : ""), x1: X(e.t), x2: X(e.t), y1: 8, y2: 50 }, svg);
    el("title", {}, tick).textContent = `node ${e.node} exposed at t=${e.t}: s = ${e.value}`;
    const li = document.createElement("li");
    li.textContent = `t=${e.t}: node ${e.node}, s = ${fmt(e.value)} (${e.how})`;
    if (later) li.className = "later";
    list.appendChild(li);
  }
  if (S.shown >= 0) el("line", { class: "cursor", x1: X(S.shown), x2: X(S.shown), y1: 4, y2: 54 }, svg);
  const seen = S.exposures.filter((e) => e.t <= S.shown).length;
  $("timeline-note").textContent = `${seen} of ${S.exposures.length} exposures by t = ${Math.max(0, S.shown)}`;
}

function drawLeakage() {
  const table = $("leak-table");
  if (!S.finished) return;
  const rows = [];
  if (S.verdicts && S.verdicts.length) {
    $("leak-note").textContent =
      "Ideal-world bound: the NMI any exact protocol must leak at this node's rank (1 = the ideal world reveals it). " +
      "Verdict: unavoidable = exposed and the ideal world exposes it too; beyond the ideal world = exposed, and no exact protocol must expose it.";
    rows.push("<tr><th>node</th><th>rank</th><th>s<sub>i</sub></th><th class='l'>learned</th><th>at t</th><th>lower</th><th>upper</th><th>ideal bound (NMI)</th><th class='l'>verdict</th></tr>");
    for (const v of S.verdicts) {
      const cls = v.verdict === "beyond the ideal world" ? "avoidable" : v.verdict === "unavoidable" ? "unavoidable" : "";
      rows.push(`<tr class="${cls}" data-row="${v.node}"><td>${v.node}</td><td>${v.rank}</td><td>${fmt(v.value)}</td>` +
        `<td class='l'>${v.status}</td><td>${v.t >= 0 ? v.t : "–"}</td><td>${fmt(v.lower)}</td><td>${fmt(v.upper)}</td>` +
        `<td>${fmt(v.bound)}</td><td class='l'>${v.verdict}</td></tr>`);
    }
  } else {
    $("leak-note").textContent = S.truth
      ? "Computing the ideal-world bound (Monte Carlo)…"
      : "What the transcript proves per node. The ideal-world bound per rank needs the ground truth " +
        "(summary.json of a testbed run next to the transcript); the output holder is marked all the same.";
    rows.push("<tr><th>node</th><th class='l'>learned</th><th>value / lower</th><th>upper</th><th>at t</th><th class='l'>ideal world</th></tr>");
    for (const v of S.nodes) {
      const ideal = v.unavoidable ? "exposes it too (holds the output)" : v.state === "corrupted" ? "corrupted" : "–";
      rows.push(`<tr data-row="${v.node}"><td>${v.node}</td><td class='l'>${v.state}</td>` +
        `<td>${fmt(v.state === "interval" ? v.lower : v.value)}</td><td>${v.state === "interval" ? fmt(v.upper) : "–"}</td>` +
        `<td>${v.t ?? "–"}</td><td class='l'>${ideal}</td></tr>`);
    }
  }
  table.innerHTML = rows.join("");
}

let pending = null;
function onSlider() {
  const slider = $("slider");
  const t = Number(slider.value);
  S.follow = t >= S.latest;
  if (pending) clearTimeout(pending);
  pending = setTimeout(async () => {
    const seq = ++S.seq;
    const resp = await fetch(`/api/at?t=${t}`);
    if (!resp.ok || seq !== S.seq) return;
    const doc = await resp.json();
    if (seq === S.seq) show(doc.t, doc.nodes);
  }, 120);
}

function connect() {
  const es = new EventSource("/api/events");
  es.addEventListener("snapshot", (ev) => onSnapshot(JSON.parse(ev.data)));
  es.addEventListener("delta", (ev) => onDelta(JSON.parse(ev.data)));
  es.onerror = () => {
    $("counters").textContent += S.finished ? "" : " · connection lost, retrying…";
  };
}

window.addEventListener("DOMContentLoaded", () => {
  $("slider").addEventListener("input", onSlider);
  $("live-btn").addEventListener("click", () => {
    $("slider").value = String(S.latest);
    onSlider();
  });
  connect();
});
