// Compare page: one chart per metric, one line per run, shared smoothing.
import { Ema, PLOT_CONFIG, baseLayout, color } from "./charts.js";

const data = JSON.parse(document.getElementById("compare-data").textContent);
const root = document.getElementById("compare-charts");
const slider = document.getElementById("smoothing");
const Plotly = window.Plotly;

document.querySelectorAll("#legend [data-run]").forEach((li, i) => {
  li.querySelector(".legend-swatch").style.color = color(i);
});

const charts = [];
if (root && data.runs.length) {
  for (const spec of data.charts) {
    const el = document.createElement("div");
    el.className = "chart";
    el.id = `compare-${spec.id}`;
    el.setAttribute("role", "img");
    el.setAttribute("aria-label", `${spec.title} of the compared runs`);
    root.append(el);
    charts.push({ el, spec });
  }
}

function draw() {
  const w = Number(slider?.value || 0);
  for (const { el, spec } of charts) {
    const traces = data.runs.map((run, i) => {
      const s = run.series[spec.series] || { x: [], y: [] };
      const ema = new Ema(w);
      return { x: s.x, y: s.y.map((v) => ema.push(v)), mode: spec.markers ? "lines+markers" : "lines",
               name: run.name, line: { color: color(i), width: 2 }, marker: { size: 4 } };
    });
    const title = spec.band ? "Reward (mean)" : spec.title;
    const empty = traces.every((t) => t.x.length === 0);
    Plotly.react(el, traces, baseLayout(title, empty), PLOT_CONFIG);
  }
}

if (slider) {
  slider.addEventListener("input", () => {
    document.getElementById("smoothing-value").textContent = Number(slider.value).toFixed(2);
    draw();
  });
}
document.addEventListener("themechange", draw);
draw();
