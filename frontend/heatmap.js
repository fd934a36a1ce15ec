// The scenario × step heatmap (Plotly, from the server's copy of plotly.js).
//
// The page embeds the API's payload (training/analytics/heatmap.py says how it is packed): rows × columns bytes,
// base64. They are decoded once into one Float32Array per row (NaN: no group), drawn as a heatmap, and
// kept up to date from the run's WebSocket: a scored group whose cell is on screen is folded into it;
// one for a scenario or a step not shown yet, and every (re)connect, fetch the view again (an ETag
// makes that a bodiless 304 when nothing changed).
//
// window.__artwebHeatmap exposes the state to tests and the benchmark: previewAt (ms since navigation
// start, the cells painted as an image), drawnAt (the interactive chart drawn), draws, live (groups folded in), cellCenter(scenarioIndex, step).

import { LiveSocket, showConnState } from "./ws.js";

let Plotly = null;  // loaded after the preview has painted (see loadPlotly)
const page = JSON.parse(document.getElementById("heatmap-data").textContent);
const el = document.getElementById("heatmap");
const hoverBox = document.getElementById("heatmap-hover");
const sortSelect = document.getElementById("id_sort");
const solvedAt = document.getElementById("solved-at");
const exposed = (window.__artwebHeatmap = { previewAt: null, drawnAt: null, draws: 0, live: 0,
                                             state: "connecting", startedAt: performance.now() });

let view;            // the decoded payload: {meta, rows: [{id, index, text, z: Float32Array, n: Uint8Array}], ...}
let order = [];      // display position → index into view.rows
let seen = new Set(); // ids of groups already folded in live (a group is sent again once its advantages exist)

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function decode(payload) {
  const nRows = payload.rows.scenario.length;
  const nCols = payload.columns.first_step.length;
  const q = Uint8Array.from(atob(payload.values.data), (c) => c.charCodeAt(0));
  const counts = Uint8Array.from(atob(payload.counts.data), (c) => c.charCodeAt(0));
  const { min, max, levels, empty } = payload.values;
  const step = (max - min) / levels;
  const rows = [];
  let k = 0;  // next count: one per non-empty cell, row-major
  for (let r = 0; r < nRows; r++) {
    const z = new Float32Array(nCols);
    const n = new Uint8Array(nCols);
    for (let c = 0; c < nCols; c++) {
      const b = q[r * nCols + c];
      if (b === empty) { z[c] = NaN; continue; }
      z[c] = min + b * step;
      n[c] = counts[k++];
    }
    rows.push({ id: payload.rows.scenario[r], index: payload.rows.index[r], text: payload.rows.text[r], z, n });
  }
  return { meta: payload, rows, byScenario: new Map(rows.map((row, i) => [row.id, i])),
           first: payload.columns.first_step, last: payload.columns.last_step };
}

// --- row orders --------------------------------------------------------------------------------------

function regression(row) {
  // Best reward before the latest cell, minus the latest: how much the scenario has lost.
  let latest = -1;
  for (let c = row.z.length - 1; c >= 0; c--) if (!Number.isNaN(row.z[c])) { latest = c; break; }
  let best = -Infinity;
  for (let c = 0; c < latest; c++) if (row.z[c] > best) best = row.z[c];
  return latest > 0 && best > -Infinity ? best - row.z[latest] : -Infinity;
}

function firstSolved(row, threshold) {
  // Cells are packed to 255 levels: a cell within half a level of the threshold reaches it.
  const v = view.meta.values;
  const slack = (v.max - v.min) / (2 * v.levels) + 1e-9;
  for (let c = 0; c < row.z.length; c++) if (row.z[c] >= threshold - slack) return c;
  return Infinity;
}

function sortRows() {
  const ids = view.rows.map((_, i) => i);
  const byIndex = (a, b) => view.rows[a].index - view.rows[b].index;
  const how = sortSelect.value;
  if (how === "regressed") {
    const key = view.rows.map(regression);
    ids.sort((a, b) => (key[b] - key[a]) || byIndex(a, b));
  } else if (how === "solved") {
    const threshold = Number(solvedAt.value);
    const key = view.rows.map((row) => firstSolved(row, threshold));
    ids.sort((a, b) => (key[a] - key[b]) || byIndex(a, b));
  } else {
    ids.sort(byIndex);
  }
  order = ids;
}

// --- drawing -----------------------------------------------------------------------------------------

function yTicks() {
  // At most ~40 labels, whatever the number of rows.
  const every = Math.max(1, Math.ceil(order.length / 40));
  const vals = [], text = [];
  for (let y = 0; y < order.length; y += every) { vals.push(y); text.push(String(view.rows[order[y]].index)); }
  return { vals, text };
}

function figure() {
  const text = css("--text"), grid = css("--border");
  const ticks = yTicks();
  const height = Math.max(320, Math.min(900, 120 + order.length * 14));
  return {
    data: [{
      type: "heatmap",
      x: view.first,
      y: order.map((_, y) => y),
      z: order.map((r) => view.rows[r].z),
      zmin: view.meta.values.min,
      zmax: view.meta.values.max > view.meta.values.min ? view.meta.values.max : view.meta.values.min + 1,
      colorscale: "Viridis",
      colorbar: { title: { text: "mean reward", side: "right" }, thickness: 12 },
      hoverongaps: true,
      hoverinfo: "none",  // the box under the chart says more (and escapes the scenario's text)
      xgap: 0, ygap: 0,
    }],
    layout: {
      height,
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: text, size: 11 },
      margin: { l: 56, r: 12, t: 12, b: 40 },
      // Few columns: a tick on each (Plotly's own would fall between steps).
      xaxis: { title: { text: view.meta.binned ? "step (first of each column)" : "step" }, gridcolor: grid,
               ...(view.first.length <= 30 ? { tickvals: view.first } : {}) },
      yaxis: { title: { text: "scenario" }, autorange: "reversed", tickvals: ticks.vals, ticktext: ticks.text,
               zeroline: false, showgrid: false },
      uirevision: `${view.meta.split}-${view.meta.step_from}-${view.meta.step_to}`,
      dragmode: "zoom",
    },
  };
}

// --- the preview: the cells as an image, before plotly.js (4.6 MB of script to evaluate) is loaded ------

// Plotly's "Viridis" colour scale (the stops of the viridis colour map), so the preview and the chart
// that replaces it show the same colours.
const VIRIDIS = ["#440154", "#48186a", "#472d7b", "#424086", "#3b528b", "#33638d", "#2c728e", "#26828e",
                 "#21918c", "#1fa088", "#28ae80", "#3fbc73", "#5ec962", "#84d44b", "#addc30", "#d8e219", "#fde725"];

function viridis(t) {
  const x = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const rgb = (hex) => [1, 3, 5].map((k) => parseInt(hex.slice(k, k + 2), 16));
  const [a, b] = [rgb(VIRIDIS[i]), rgb(VIRIDIS[i + 1])];
  return a.map((v, k) => Math.round(v + (b[k] - v) * (x - i)));
}

// The colour of each of 256 levels, computed once: a preview has up to hundreds of thousands of cells.
const LUT = Array.from({ length: 256 }, (_, i) => viridis(i / 255));

function drawPreview() {
  const rows = order.length, cols = view.first.length;
  if (!rows || !cols) return null;
  const { min, max } = view.meta.values;
  const span = max > min ? max - min : 1;
  const canvas = document.createElement("canvas");
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols, rows);
  for (let y = 0; y < rows; y++) {
    const z = view.rows[order[y]].z;
    for (let x = 0; x < cols; x++) {
      if (Number.isNaN(z[x])) continue;  // transparent: no group
      const [r, g, b] = LUT[Math.round(((z[x] - min) / span) * 255)] || LUT[0];
      const o = (y * cols + x) * 4;
      img.data[o] = r; img.data[o + 1] = g; img.data[o + 2] = b; img.data[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  // Where the chart's plot area will be (figure()'s margins; the colour bar takes about 70 px).
  const height = Math.max(320, Math.min(900, 120 + rows * 14));
  Object.assign(canvas.style, { display: "block", imageRendering: "pixelated", margin: "12px 82px 40px 56px",
                                width: "calc(100% - 138px)", height: `${height - 52}px` });
  canvas.id = "heatmap-preview";
  canvas.setAttribute("aria-hidden", "true");
  el.append(canvas);
  return canvas;
}

function loadPlotly() {
  return new Promise((resolve, reject) => {
    if (window.Plotly) { resolve(window.Plotly); return; }
    const script = document.createElement("script");
    script.src = el.dataset.plotly;
    script.onload = () => resolve(window.Plotly);
    script.onerror = () => reject(new Error(`could not load ${script.src}`));
    document.head.append(script);
  });
}

let pending = false;
function draw() {
  if (pending || !Plotly) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    const empty = view.rows.length === 0;
    document.getElementById("heatmap-empty").hidden = !empty;
    el.hidden = empty;
    if (empty) return;
    const fig = figure();
    Plotly.react(el, fig.data, fig.layout, { responsive: true, displaylogo: false,
                                              modeBarButtonsToRemove: ["lasso2d", "select2d"] })
      .then(() => {
        document.getElementById("heatmap-preview")?.remove();
        exposed.draws += 1;
        if (exposed.drawnAt !== null) return;
        exposed.drawnAt = performance.now();
        // Plotly gives the element its .on() with the first plot.
        el.on("plotly_hover", onHover);
        el.on("plotly_click", onClick);
        el.on("plotly_relayout", onRelayout);
      });
  });
}

// --- hover and click ---------------------------------------------------------------------------------

function cellAt(point) {
  const [y, c] = point.pointNumber;
  const row = view.rows[order[y]];
  return { row, c, value: row.z[c], groups: row.n[c], first: view.first[c], last: view.last[c] };
}

function stepsText(cell) {
  return cell.first === cell.last ? `step ${cell.first}` : `steps ${cell.first}–${cell.last}`;
}

function onHover(event) {
  const cell = cellAt(event.points[0]);
  const reward = Number.isNaN(cell.value) ? "no group"
    : `mean reward ${cell.value.toFixed(3)} (${cell.groups} group${cell.groups === 1 ? "" : "s"})`;
  // textContent: a scenario is the user's data, never markup.
  hoverBox.textContent = `Scenario ${cell.row.index} · ${stepsText(cell)} · ${reward}` +
    (cell.row.text ? ` · ${cell.row.text}` : "");
  hoverBox.dataset.scenario = cell.row.index;
  hoverBox.dataset.step = cell.first;
}

function onClick(event) {
  const cell = cellAt(event.points[0]);
  if (view.meta.binned) {
    // A column of several steps: zoom in to single steps around it (as many as fit unbinned).
    const width = view.meta.columns.first_step.length;
    const centre = Math.round((cell.first + cell.last) / 2);
    const from = Math.max(0, centre - Math.floor(width / 2));
    location.assign(viewUrl({ from, to: from + width - 1 }));
    return;
  }
  if (Number.isNaN(cell.value)) return;  // no group to open
  const q = new URLSearchParams({ step: cell.first, split: view.meta.split, scenario: cell.row.index });
  location.assign(`${page.inspector_url}?${q}`);
}

function viewUrl(extra = {}) {
  const q = new URLSearchParams({ split: view.meta.split, sort: sortSelect.value });
  const from = extra.from ?? view.meta.step_from, to = extra.to ?? view.meta.step_to;
  if (from !== null && from !== undefined) q.set("from", from);
  if (to !== null && to !== undefined) q.set("to", to);
  return `${page.page_url}?${q}`;
}

// A drag-zoom over steps fills the step range: "Show" then fetches those steps at full resolution.
function onRelayout(event) {
  const lo = event["xaxis.range[0]"], hi = event["xaxis.range[1]"];
  if (lo === undefined || hi === undefined) return;
  document.getElementById("id_from").value = Math.max(0, Math.ceil(lo));
  document.getElementById("id_to").value = Math.max(0, Math.floor(hi));
}

exposed.cellCenter = (scenarioIndex, step) => {
  // Page coordinates of a point inside the cell of a scenario and a step (for tests and the benchmark):
  // a heatmap brick is centred on its column's x and its row's y.
  const y = order.findIndex((r) => view.rows[r].index === scenarioIndex);
  const c = column(step);
  if (y < 0 || c < 0) return null;
  const layout = el._fullLayout, box = el.getBoundingClientRect();
  return { x: box.left + window.scrollX + layout._size.l + layout.xaxis.l2p(view.first[c]),
           y: box.top + window.scrollY + layout._size.t + layout.yaxis.l2p(y) };
};
exposed.cell = (scenarioIndex, step) => {
  const row = view.rows.find((r) => r.index === scenarioIndex);
  const c = view.first.findIndex((first, i) => first <= step && step <= view.last[i]);
  return row && c >= 0 ? { value: Number.isNaN(row.z[c]) ? null : row.z[c], groups: row.n[c] } : null;
};
exposed.order = () => order.map((r) => view.rows[r].index);

// --- live --------------------------------------------------------------------------------------------

function column(step) {
  // Binary search for the column whose steps include step; -1 past the last or in no column.
  let lo = 0, hi = view.first.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (step < view.first[mid]) hi = mid - 1;
    else if (step > view.last[mid]) lo = mid + 1;
    else return mid;
  }
  return -1;
}

let refetchTimer = null;
function refetchSoon(delay = 800) {
  clearTimeout(refetchTimer);
  refetchTimer = setTimeout(refetch, delay);
}

async function refetch() {
  const q = new URLSearchParams({ split: view.meta.split });
  if (view.meta.step_from !== null) q.set("from", view.meta.step_from);
  if (view.meta.step_to !== null) q.set("to", view.meta.step_to);
  let response;
  try {
    response = await fetch(`${page.api_url}?${q}`, { headers: { "If-None-Match": page.etag }, credentials: "same-origin" });
  } catch (_) {
    return;  // the socket reconnects and asks again
  }
  if (response.status !== 200) return;  // 304: nothing changed
  page.etag = response.headers.get("ETag");
  const fresh = decode(await response.json());
  // Groups folded in live that the new payload already counts are forgotten; newer ones stay out of
  // it and arrive again only if sent again, so keep them folded in.
  view = fresh;
  seen = new Set([...seen].filter((id) => id > view.meta.last_group));
  sortRows();
  draw();
}

function onGroup(msg) {
  if (msg.split !== view.meta.split || msg.failed_attempt || msg.reward_mean === null) return;
  if (msg.id <= view.meta.last_group || seen.has(msg.id)) return;
  if (view.meta.step_from !== null && msg.step < view.meta.step_from) return;
  if (view.meta.step_to !== null && msg.step > view.meta.step_to) return;
  const r = view.byScenario.get(msg.scenario);
  const c = column(msg.step);
  if (r === undefined || c < 0) { refetchSoon(); return; }  // a new row or column: the server places it
  seen.add(msg.id);
  const row = view.rows[r];
  const n = row.n[c];
  row.z[c] = n && !Number.isNaN(row.z[c]) ? (row.z[c] * n + msg.reward_mean) / (n + 1) : msg.reward_mean;
  row.n[c] = Math.min(255, n + 1);
  exposed.live += 1;
  draw();
}

view = decode(page.heatmap);
exposed.decodedAt = performance.now();
sortSelect.value = page.sort;
sortRows();
// The cells first, as an image; then, once that frame is on screen, the interactive chart replaces it.
if (drawPreview()) {
  requestAnimationFrame(() => setTimeout(() => { exposed.previewAt = performance.now(); }));
}
requestAnimationFrame(() => setTimeout(() => {
  loadPlotly().then((lib) => { Plotly = lib; draw(); }, (err) => {
    hoverBox.textContent = `The interactive chart could not load (${err.message}); reload the page.`;
  });
}));


sortSelect.addEventListener("change", () => {
  sortRows();
  draw();
  history.replaceState(null, "", viewUrl());
});
solvedAt.addEventListener("change", () => { if (sortSelect.value === "solved") { sortRows(); draw(); } });
document.querySelectorAll("#heatmap-split input").forEach((radio) =>
  radio.addEventListener("change", () => radio.form.requestSubmit()));

const showState = showConnState(document.getElementById("live-state"));
exposed.socket = new LiveSocket(page.ws_path, {
  onMessage: (msg) => { if (msg.type === "group") onGroup(msg); },
  // No catch-up through the socket (it carries a few groups at most): each open fetches the view
  // again instead, which costs a 304 when nothing was missed.
  catchUp: () => { refetch(); return null; },
  onState: (state) => { exposed.state = state; showState(state); },
});
