// Reward-health page: error table, reward latency (p50/p95 per step), slowest trajectories.
//
// The page starts from the same JSON the API serves (GET /api/v1/runs/<id>/reward-health/), embedded in
// #health-data; while the run writes steps, the run's socket says so and the page fetches that JSON again.

import { baseLayout, color, PLOT_CONFIG } from "./charts.js";
import { LiveSocket, showConnState } from "./ws.js";

const Plotly = window.Plotly;
const page = JSON.parse(document.getElementById("health-data").textContent);
const REFRESH_AFTER_MS = 500; // messages of one step arrive in a burst (groups, then the step): one fetch

function ms(value) {
  if (value === null || value === undefined) return "—";
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${Math.round(value)} ms`;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.append(td);
  return td;
}

function link(href, text) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

function firstLine(text, max = 160) {
  const line = (text || "").split("\n", 1)[0];
  return line.length > max ? `${line.slice(0, max)}…` : line;
}

function drawSummary(h) {
  document.getElementById("health-trajectories").textContent = String(h.trajectories);
  document.getElementById("health-timed").textContent = String(h.reward_timed);
  document.getElementById("health-p50").textContent = ms(h.latency.p50_ms);
  document.getElementById("health-p95").textContent = ms(h.latency.p95_ms);
  document.getElementById("health-max").textContent = ms(h.latency.max_ms);
}

function drawErrors(errors) {
  const body = document.querySelector("#health-errors tbody");
  body.replaceChildren(...errors.map((e) => {
    const row = document.createElement("tr");
    row.dataset.stage = e.stage;
    row.dataset.type = e.type;
    cell(row, e.stage);
    cell(row, e.type).className = "mono";
    cell(row, String(e.count), "num").dataset.count = "";
    const example = cell(row, "");
    example.append(link(e.example.link, `#${e.example.trajectory} (step ${e.example.step})`));
    const quote = document.createElement("div");
    quote.className = "muted";
    quote.textContent = firstLine(e.example.message);
    quote.title = e.example.message;
    example.append(quote);
    return row;
  }));
  document.getElementById("health-errors-empty").hidden = errors.length > 0;
}

function drawSlowest(slowest) {
  const body = document.querySelector("#health-slowest tbody");
  body.replaceChildren(...slowest.map((t) => {
    const row = document.createElement("tr");
    row.dataset.trajectory = String(t.trajectory);
    cell(row, "").append(link(t.link, `#${t.trajectory}`));
    cell(row, String(t.step), "num");
    cell(row, ms(t.reward_ms), "num");
    cell(row, t.reward === null ? "—" : t.reward.toFixed(3), "num");
    cell(row, firstLine(t.error, 120));
    return row;
  }));
  document.getElementById("health-slowest-empty").hidden = slowest.length > 0;
}

// Steps are whole numbers: with few of them, tick each one rather than let Plotly tick 1.2, 1.4, …
function stepAxis(layout, steps) {
  if (steps.length > 0 && steps.length <= 20) layout.xaxis = { ...layout.xaxis, tickmode: "array", tickvals: steps };
  return layout;
}

function drawCharts(perStep) {
  const steps = perStep.map((s) => s.step);
  const empty = steps.length === 0;
  const latency = [
    { name: "p50", x: steps, y: perStep.map((s) => s.p50_ms), mode: "lines+markers", line: { color: color(0) } },
    { name: "p95", x: steps, y: perStep.map((s) => s.p95_ms), mode: "lines+markers", line: { color: color(1) } },
  ];
  const latencyLayout = { ...baseLayout("Reward time per step (ms): p50, p95", empty), showlegend: !empty };
  Plotly.react("chart-latency", latency, stepAxis(latencyLayout, steps), PLOT_CONFIG);
  const errors = [{ name: "reward errors", type: "bar", x: steps, y: perStep.map((s) => s.reward_error_share),
                    marker: { color: color(1) } }];
  const errorsLayout = baseLayout("Share of trajectories whose reward failed", empty);
  errorsLayout.yaxis = { ...errorsLayout.yaxis, range: [0, 1], tickformat: ".0%" };
  Plotly.react("chart-errors", errors, stepAxis(errorsLayout, steps), PLOT_CONFIG);
}

function draw(h) {
  drawSummary(h);
  drawErrors(h.errors);
  drawSlowest(h.slowest);
  drawCharts(h.per_step);
  state.drawn += 1;
}

// Exposed for tests and the console: how many times the panel was drawn, and the socket's state.
const state = { drawn: 0, socket: "connecting" };
window.__artwebHealth = state;

let timer = null;
let inFlight = false;
let again = false;

async function refresh() {
  if (inFlight) { again = true; return; }
  inFlight = true;
  try {
    const response = await fetch(page.api_url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (response.ok) draw(await response.json());
  } catch (_) { /* server restarting: the next message or reconnect fetches again */ }
  inFlight = false;
  if (again) { again = false; refresh(); }
}

function soon() {
  clearTimeout(timer);
  timer = setTimeout(refresh, REFRESH_AFTER_MS);
}

draw(page.health);
const showState = showConnState(document.getElementById("live-state"));
new LiveSocket(page.ws_path, {
  onMessage: (msg) => { if (msg.type === "step" || msg.type === "group") soon(); },
  onState: (s) => {
    state.socket = s;
    showState(s);
    // Steps written between the page's render and this (re)connect came with no message: fetch once.
    if (s === "open") soon();
  },
});
