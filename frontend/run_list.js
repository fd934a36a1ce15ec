// Runs list: status, progress and latest reward of the listed runs, live from ws/runs/ (status and
// step messages, each naming its run).
import { LiveSocket, showConnState } from "./ws.js";

const table = document.getElementById("runs-table");
const rows = new Map();
if (table) for (const tr of table.querySelectorAll("tr[data-run]")) rows.set(Number(tr.dataset.run), tr);

function update(msg) {
  const tr = rows.get(Number(msg.run));
  if (!tr) return; // not on this page
  if (msg.status) {
    const badge = tr.querySelector("[data-status]");
    badge.textContent = msg.status;
    badge.className = `badge status-${msg.status}`;
  }
  if (msg.steps_done != null && msg.num_steps) {
    const bar = tr.querySelector("[data-progress]");
    bar.max = msg.num_steps;
    bar.value = msg.steps_done;
    tr.querySelector("[data-steps]").textContent = `${msg.steps_done}/${msg.num_steps}`;
  }
  const latest = msg.type === "step" ? (msg.metrics || {}).reward_mean : msg.latest_reward;
  if (typeof latest === "number") tr.querySelector("[data-latest]").textContent = latest.toFixed(3);
}

new LiveSocket("/ws/runs/", {
  onMessage: (msg) => { if (msg.type === "status" || msg.type === "step") update(msg); },
  onState: showConnState(document.getElementById("live-state")),
});
