// Re-score page: follows progress while the re-score runs (polling its API), then draws the original and
// re-scored reward curves by step and the old-against-new scatter (Plotly, as the run page's charts).
import { PLOT_CONFIG, baseLayout, color } from "./charts.js";

const data = JSON.parse(document.getElementById("rescore-data").textContent);
const Plotly = window.Plotly;
const POLL_MS = 1500;

function inspectorLink(trajectory, step) {
  return `${data.inspector}?step=${step}&split=${data.split}&traj=${trajectory}`;
}

function drawCurve() {
  const el = document.getElementById("rescore-curve");
  const curve = data.curve;
  if (!el || !curve) return;
  const traces = [
    { x: curve.steps, y: curve.old, name: "original reward", mode: "lines+markers", line: { color: color(0) } },
    { x: curve.steps, y: curve.new, name: "re-scored", mode: "lines+markers", line: { color: color(1) } },
  ];
  const layout = { ...baseLayout("Mean reward per step: original and re-scored", !curve.steps.length),
                   showlegend: true, legend: { orientation: "h", y: -0.25 } };
  layout.xaxis = { ...layout.xaxis, tickformat: "d" }; // steps are whole numbers
  Plotly.newPlot(el, traces, layout, PLOT_CONFIG);
}

function drawScatter() {
  const el = document.getElementById("rescore-scatter");
  const s = data.scatter;
  if (!el || !s) return;
  const trace = {
    x: s.old, y: s.new, mode: "markers", type: "scattergl", marker: { color: color(0), size: 6, opacity: 0.6 },
    customdata: s.trajectory.map((t, i) => [t, s.step[i]]),
    hovertemplate: "trajectory #%{customdata[0]} (step %{customdata[1]})<br>old %{x:.3f} → new %{y:.3f}<extra></extra>",
  };
  const layout = baseLayout("Old against new reward (click a point to open it)", !s.old.length);
  layout.xaxis = { ...layout.xaxis, title: { text: "old reward" } };
  layout.yaxis = { ...layout.yaxis, title: { text: "new reward" } };
  layout.hovermode = "closest";
  Plotly.newPlot(el, [trace], layout, PLOT_CONFIG);
  el.on("plotly_click", (event) => {
    const [trajectory, step] = event.points[0].customdata;
    window.location.href = inspectorLink(trajectory, step);
  });
}

function showProgress(body) {
  const bar = document.getElementById("rescore-progress");
  const count = document.getElementById("rescore-count");
  bar.max = Math.max(1, body.trajectories_total);
  bar.value = body.trajectories_done;
  count.textContent = `${body.trajectories_done} / ${body.trajectories_total} trajectories`;
  const badge = document.querySelector("[data-status]");
  badge.textContent = body.status;
  badge.className = `badge status-${body.status}`;
}

async function poll() {
  let status = data.status;
  while (status === "queued" || status === "running") {
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    let body;
    try {
      const response = await fetch(data.api, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (!response.ok) continue;
      body = await response.json();
    } catch (e) {
      continue; // the server is away for a moment: try again at the next tick
    }
    showProgress(body);
    if (body.status !== status && (body.status === "done" || body.status === "failed")) {
      window.location.reload(); // the figures, charts and table are drawn from the database
      return;
    }
    status = body.status;
  }
}

function start() {
  if (Plotly) {
    drawCurve();
    drawScatter();
  }
  poll();
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
