// Runs list, live from ws/runs/: status, progress and rewards of the listed runs (status and step
// messages, each naming its run), every field of a row ("run" messages: the row as the server built the
// first paint's, training.services.broadcast.run_row_message, sent after each status change and step),
// and runs created after the page loaded (a "run" message of a run not listed yet).
//
// A new run goes at the top of the table when the page lists the newest runs first, unfiltered, page 1;
// anywhere else it might not belong here, so the page names it in a notice with a link instead.
import { fixed3, showStatus, showWhen } from "./status.js";
import { LiveSocket, showConnState } from "./ws.js";

const root = document.getElementById("runs-live");
const table = document.getElementById("runs-table");
const rows = new Map();
if (table) for (const tr of table.querySelectorAll("tr[data-run]")) rows.set(Number(tr.dataset.run), tr);
let lastRun = Number(root?.dataset.lastRun || 0);
const insertsNew = root?.dataset.insertsNew === "1";
const perPage = Number(root?.dataset.perPage || 50);

const runUrl = (id) => root.dataset.runUrl.replace(/\/0\/$/, `/${id}/`);
const notYet = () => Object.assign(document.createElement("span"), { className: "muted", textContent: "not yet" });

function update(tr, msg) {
  if (msg.status) showStatus(tr.querySelector("[data-status]"), msg.status);
  // A client-driven run starts with no steps to do: its client's training jobs add them.
  if (msg.steps_done != null && msg.num_steps != null) {
    const bar = tr.querySelector("[data-progress]");
    if (msg.num_steps) bar.max = msg.num_steps;
    bar.value = msg.steps_done;
    tr.querySelector("[data-steps]").textContent = `${msg.steps_done}/${msg.num_steps}`;
  }
  if (msg.type === "step") {
    const reward = (msg.series || msg.metrics || {}).reward_mean;
    if (typeof reward === "number") tr.querySelector("[data-latest]").textContent = fixed3(reward);
  }
  if (msg.type !== "run") return;
  tr.querySelector("[data-latest]").textContent = fixed3(msg.latest_reward);
  tr.querySelector("[data-best]").textContent = fixed3(msg.best_val_reward);
  showWhen(tr.querySelector("[data-started]"), msg.started_at, notYet());
}

function field(tr, name, text) {
  const cell = tr.querySelector(`[data-field="${name}"]`);
  if (cell) cell.textContent = text;
  return cell;
}

function buildRow(msg) {
  const tr = document.getElementById("run-row").content.firstElementChild.cloneNode(true);
  tr.dataset.run = msg.run;
  const select = tr.querySelector('[data-field="select"]');
  select.value = msg.run;
  select.setAttribute("aria-label", `Select ${msg.name} for comparison`);
  field(tr, "name", msg.name).href = runUrl(msg.run);
  const tags = tr.querySelector('[data-field="tags"]');
  for (const t of msg.tags || []) {
    const a = Object.assign(document.createElement("a"), { className: "tag", textContent: t });
    a.href = `?${new URLSearchParams({ tag: t })}`;
    tags.append(a);
  }
  field(tr, "base_model", msg.base_model);
  field(tr, "task", msg.task);
  // A client-driven run's task is "ART client", with no version.
  field(tr, "task_version", msg.task_version != null ? `v${msg.task_version}` : "");
  field(tr, "owner", msg.owner);
  tr.querySelector("[data-progress]").setAttribute("aria-label", `progress of ${msg.name}`);
  update(tr, msg);
  return tr;
}

function addRun(msg) {
  const row = buildRow(msg);
  const tbody = table.tBodies[0];
  tbody.prepend(row);
  rows.set(msg.run, row);
  table.hidden = false;
  document.getElementById("runs-empty")?.remove();
  while (tbody.rows.length > perPage) {
    const last = tbody.rows[tbody.rows.length - 1];
    rows.delete(Number(last.dataset.run));
    last.remove();
  }
  const count = document.getElementById("runs-count");
  const n = Number(count.dataset.count) + 1;
  count.dataset.count = n;
  count.textContent = `${n} run${n === 1 ? "" : "s"}`;
}

function noteRun(msg) {
  const notice = document.getElementById("new-runs");
  const a = Object.assign(document.createElement("a"), { href: runUrl(msg.run), textContent: msg.name });
  a.dataset.run = msg.run;
  notice.append(a);
  notice.hidden = false;
}

function onRun(msg) {
  const tr = rows.get(Number(msg.run));
  if (tr) return update(tr, msg);
  if (msg.run <= lastRun) return; // an older run this page leaves out (a filter, another page)
  lastRun = msg.run;
  if (insertsNew && table) addRun(msg);
  else if (root) noteRun(msg);
}

function onMessage(msg) {
  if (msg.type === "run") onRun(msg);
  else if (msg.type === "status" || msg.type === "step") {
    const tr = rows.get(Number(msg.run));
    if (tr) update(tr, msg);
  } else if (msg.type === "queue") {
    const cell = rows.get(Number(msg.run))?.querySelector("[data-queue]");
    if (!cell) return;
    // Its place in the fair queue while it waits for a GPU worker; a message with no place: out of it.
    cell.hidden = msg.place == null;
    cell.textContent = msg.place == null ? "" : `#${msg.place} in queue`;
    cell.title = msg.reason || "";
  }
}

new LiveSocket("/ws/runs/", {
  onMessage,
  // The rows shown (their state may have moved on) and the runs created since the newest one known.
  catchUp: () => ({ type: "catch_up", after_run: lastRun, runs: [...rows.keys()] }),
  onState: showConnState(document.getElementById("live-state")),
});
