// The run page: charts from the embedded first data, then live over ws/runs/<id>/.
//
// window.__artwebLive.received[step] / .points[step] record when each live step arrived and when it
// was drawn (epoch ms); the page benchmark reads them to measure commit-to-screen latency.
import { MetricChart, restyleOnThemeChange } from "./charts.js";
import { fixed3, showStatus, showWhen } from "./status.js";
import { LiveSocket, showConnState } from "./ws.js";

const data = JSON.parse(document.getElementById("run-data").textContent);
const state = {
  status: data.summary.status,
  actions: data.actions || [], // what the server allows now (training.services.runs.run_actions)
  stepsDone: data.summary.steps_done,
  numSteps: data.summary.num_steps,
  lastStep: data.last_step ?? -1,
  lastEvent: data.last_event || 0,
  lastLog: data.last_log || 0,
  lastGroup: 0,
};
const live = (window.__artwebLive = { points: {}, received: {}, messages: 0 });

// --- charts ---------------------------------------------------------------------------------------
const slider = document.getElementById("smoothing");
const smoothing = () => Number(slider?.value || 0);
const charts = [];
for (const spec of data.charts) {
  const el = document.getElementById(`chart-${spec.id}`);
  if (!el) continue;
  const s = data.series[spec.series] || { x: [], y: [] };
  const init = spec.band ? { x: s.x, y: s.y, std: (data.series.reward_band || {}).std || [] } : s;
  charts.push(new MetricChart(el, spec, init, smoothing()));
}
restyleOnThemeChange(() => charts);
if (slider) {
  const out = document.getElementById("smoothing-value");
  slider.addEventListener("input", () => {
    out.textContent = smoothing().toFixed(2);
    for (const c of charts) c.setSmoothing(smoothing());
  });
}

// --- status, progress, ETA --------------------------------------------------------------------------
const durations = [...((data.series.duration_s || {}).y || [])].slice(-20);
// No time left to tell: a finished run, or a client-driven one waiting for its client's next job.
const NO_ETA = ["completed", "failed", "cancelled", "waiting"];

function fmtDuration(s) {
  if (!isFinite(s) || s < 0) return "—";
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function renderStatus() {
  showStatus(document.getElementById("run-status"), state.status);
  const bar = document.getElementById("run-progress");
  bar.max = state.numSteps;
  bar.value = state.stepsDone;
  document.getElementById("run-steps").textContent = `${state.stepsDone} / ${state.numSteps}`;
  const eta = document.getElementById("run-eta");
  if (NO_ETA.includes(state.status)) eta.textContent = "—";
  else if (durations.length) {
    const mean = durations.reduce((a, b) => a + b, 0) / durations.length;
    eta.textContent = fmtDuration(mean * (state.numSteps - state.stepsDone));
  } else eta.textContent = "—";
  // The buttons the server's answer allows; the page knows no rule of its own.
  for (const button of document.querySelectorAll("#run-actions [data-action]")) {
    button.disabled = !state.actions.includes(button.dataset.action);
  }
}

// --- the summary, the error and the checkpoints -----------------------------------------------------
// The figures besides the charts, from the builder of the first paint (training.services.broadcast.
// run_summary): the page data's, then each summary message's and a catch-up's status message's. A
// message sets the fields it names.
function applySummary(msg) {
  if ("status" in msg) state.status = msg.status;
  if (typeof msg.steps_done === "number") state.stepsDone = msg.steps_done;
  if (typeof msg.num_steps === "number") state.numSteps = msg.num_steps;
  if ("latest_reward" in msg) document.getElementById("run-latest").textContent = fixed3(msg.latest_reward);
  if ("best_val_reward" in msg) document.getElementById("run-best").textContent = fixed3(msg.best_val_reward);
  if ("started_at" in msg) showWhen(document.getElementById("run-started"), msg.started_at, "—");
  if ("checkpoints" in msg) document.getElementById("checkpoints-count").textContent = String(msg.checkpoints);
  if ("error" in msg) {
    const box = document.getElementById("run-error");
    box.querySelector("pre").textContent = msg.error || "";
    box.hidden = !msg.error;
  }
  renderStatus();
}

// A row of the Checkpoints tab (training.services.broadcast.checkpoint_message), as the template draws it.
function checkpointRow(c) {
  const promoted = c.promoted ? el("span", { className: "badge status-completed", textContent: "promoted",
    dataset: { promoted: "" } }) : null;
  const created = el("td");
  showWhen(created, c.created_at, "");
  const download = c.download ? el("a", { href: c.download, download: "", textContent: "Download adapter (.tar.gz)" }) : null;
  return el("tr", { dataset: { checkpoint: c.id, step: c.step } },
    el("td", {}, String(c.step), promoted && " ", promoted),
    el("td", { textContent: c.state }),
    el("td", { className: "num", textContent: c.size }),
    el("td", { className: "num", textContent: fixed3(c.val_reward) }),
    created,
    el("td", {}, download));
}

// A new checkpoint goes in by step (newest first); a known one is drawn anew in place.
function addCheckpoint(c) {
  const body = document.getElementById("checkpoint-rows");
  body.querySelector("[data-empty]")?.remove();
  // A run has one promoted checkpoint at most (training.services.checkpoints.checkpoint_promote).
  if (c.promoted) for (const badge of body.querySelectorAll("[data-promoted]")) badge.remove();
  const row = checkpointRow(c);
  const shown = body.querySelector(`[data-checkpoint="${c.id}"]`);
  if (shown) return shown.replaceWith(row);
  const after = [...body.rows].find((r) => Number(r.dataset.step) < c.step);
  body.insertBefore(row, after || null);
}

// --- timeline and logs ----------------------------------------------------------------------------
function appendItem(listId, node, cap) {
  const list = document.getElementById(listId);
  list.querySelector(".empty")?.remove();
  const stick = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
  list.append(node);
  while (list.children.length > cap) list.firstElementChild.remove();
  if (stick) list.scrollTop = list.scrollHeight;
}

function addEvent(msg) {
  if (msg.id <= state.lastEvent) return;
  state.lastEvent = msg.id;
  const li = document.createElement("li");
  const time = document.createElement("time");
  time.dateTime = msg.created_at || "";
  time.textContent = msg.created_at ? new Date(msg.created_at).toLocaleTimeString() : "";
  const kind = document.createElement("span");
  kind.className = "badge";
  kind.textContent = msg.kind;
  li.append(time, " ", kind, " ", msg.message || "");
  appendItem("events", li, 500);
  if (msg.level === "warning") addWarning(msg);
}

// A warning event is also a banner at the top of the page, with its link to the examples.
function addWarning(msg) {
  const box = document.getElementById("run-warnings");
  if (!box) return;
  const banner = document.createElement("div");
  banner.className = "alert alert-warning";
  banner.setAttribute("role", "alert");
  banner.dataset.kind = msg.kind;
  banner.append(msg.message || "");
  if (msg.link) {
    const a = document.createElement("a");
    a.href = msg.link;
    a.textContent = "See examples";
    banner.append(" ", a);
  }
  box.prepend(banner);
}

function addLog(msg) {
  if (msg.id <= state.lastLog) return;
  state.lastLog = msg.id;
  const li = document.createElement("li");
  li.className = `level-${msg.level}`;
  li.textContent = `${msg.step != null ? `[step ${msg.step}] ` : ""}${msg.level} ${msg.message}`;
  appendItem("logs", li, 1000);
}

// --- live groups ----------------------------------------------------------------------------------
// Each scored group arrives when it is persisted, with its rewards, and again with its advantages once
// the step's update is done; the second message replaces the first in place. Newest first.
const groupList = document.getElementById("groups-live");
const groupsShown = data.groups_shown || 20;
const groups = new Map(); // id -> the group's latest message, for the ones on the page

function num(x, digits, signed = false) {
  if (typeof x !== "number") return "—";
  return `${signed && x > 0 ? "+" : ""}${x.toFixed(digits)}`;
}

// An element with properties (dataset entries under `dataset`) and children; text goes in as text.
function el(tag, { dataset = {}, ...props } = {}, ...children) {
  const node = Object.assign(document.createElement(tag), props);
  Object.assign(node.dataset, dataset);
  node.append(...children.filter((c) => c != null));
  return node;
}

function inspectorUrl(params) {
  return `${groupList.dataset.inspector}?${new URLSearchParams(params)}`;
}

// A training group whose update has not stored advantages yet (its step is not done).
function awaitsAdvantages(msg) {
  return msg.split === "train" && !msg.failed_attempt && msg.advantages == null && msg.step > state.stepsDone;
}

function valuesTable(msg) {
  const head = el("tr", {}, el("th", { scope: "col", textContent: "rollout" }),
    ...msg.rewards.map((_, i) => el("th", { scope: "col", className: "num", textContent: `#${i}` })));
  const rewards = el("tr", {}, el("th", { scope: "row", textContent: "reward" }),
    ...msg.rewards.map((r) => el("td", { className: "num", textContent: num(r, 2) })));
  const rows = [rewards];
  if (msg.split === "train") {
    const adv = msg.advantages || msg.rewards.map(() => null);
    rows.push(el("tr", { dataset: { advantages: msg.advantages ? "known" : "pending" } },
      el("th", { scope: "row", textContent: "advantage" }),
      ...adv.map((a) => el("td", {
        className: `num ${a > 0 ? "adv-pos" : a < 0 ? "adv-neg" : ""}`,
        textContent: a == null ? (awaitsAdvantages(msg) ? "…" : "—") : num(a, 2, true),
      }))));
  }
  return el("div", { className: "table-wrap" }, el("table", { className: "group-values" },
    el("thead", {}, head), el("tbody", {}, ...rows)));
}

function answer(kind, a, msg) {
  if (!a) return null;
  const label = `${kind} · #${a.index} · reward ${num(a.reward, 2)}`;
  const text = a.text || (a.error ? `error: ${a.error}` : "(no answer)");
  return el("div", { className: `answer answer-${kind.toLowerCase()}`, dataset: { answer: kind.toLowerCase() } },
    el("span", { className: "label", textContent: label }), " ",
    el("a", { className: "quote", href: inspectorUrl({ step: msg.step, split: msg.split, traj: a.trajectory }),
      textContent: text }));
}

function renderGroup(msg) {
  const badges = [];
  if (awaitsAdvantages(msg)) badges.push(el("span", { className: "badge status-running", textContent: "training…" }));
  if (msg.failed_attempt) {
    badges.push(el("span", { className: "badge status-failed", title: "This attempt at the step failed; never trained on.",
      textContent: "failed attempt" }));
  }
  if (msg.split === "train" && msg.skipped) {
    badges.push(el("span", { className: "badge", title: "All rewards are equal: GRPO learns nothing from it.",
      textContent: "no signal" }));
  }
  if (msg.error_count) {
    badges.push(el("span", { className: "badge status-failed",
      textContent: `${msg.error_count} error${msg.error_count === 1 ? "" : "s"}` }));
  }
  const head = el("div", { className: "group-head row" },
    el("a", { href: inspectorUrl({ step: msg.step, split: msg.split }), textContent: `Step ${msg.step} · ${msg.split}` }),
    el("span", { className: "muted", textContent: `scenario ${msg.scenario_index}` }),
    el("span", { textContent: `reward ${num(msg.reward_mean, 3)} ± ${num(msg.reward_std, 3)}` }),
    ...badges);
  return el("li", { className: "live-group", dataset: { group: msg.id, step: msg.step } },
    head, valuesTable(msg), answer("Best", msg.best, msg), answer("Worst", msg.worst, msg));
}

function addGroup(msg) {
  const shown = groupList.querySelector(`[data-group="${msg.id}"]`);
  if (shown) { // the same group again, now with its advantages
    groups.set(msg.id, msg);
    shown.replaceWith(renderGroup(msg));
    return;
  }
  if (msg.id <= state.lastGroup) return; // older than every group shown: off the list already
  state.lastGroup = msg.id;
  groups.set(msg.id, msg);
  groupList.querySelector(".empty")?.remove();
  groupList.prepend(renderGroup(msg));
  while (groupList.children.length > groupsShown) {
    groups.delete(Number(groupList.lastElementChild.dataset.group));
    groupList.lastElementChild.remove();
  }
}

// Groups shown without advantages: catch-up sends them again, in case the advantages came meanwhile.
const pendingGroups = () => [...groups.values()].filter((g) => g.split === "train" && g.advantages == null)
  .map((g) => g.id);

// --- live steps -----------------------------------------------------------------------------------
function addStep(msg) {
  if (msg.step <= state.lastStep) return; // already drawn (catch-up overlap or duplicate delivery)
  live.received[msg.step] = performance.timeOrigin + performance.now();
  state.lastStep = msg.step;
  // Each chart's point, by the rule of the first paint (training.services.broadcast.step_series).
  const m = msg.series || msg.metrics || {};
  const draws = charts.filter((c) => typeof m[c.spec.series] === "number" && isFinite(m[c.spec.series]));
  // The reward chart first, each of the others in a task of its own: a redraw of a 2,000-point chart
  // takes tens of ms, and the headline curve should not wait behind seven others.
  const drawOne = (c) => c.append(msg.step, m[c.spec.series], m.reward_std);
  const first = draws.shift();
  Promise.resolve(first && drawOne(first)).then(() => {
    live.points[msg.step] = performance.timeOrigin + performance.now();
  });
  draws.forEach((c, i) => setTimeout(() => drawOne(c), i));
  if (typeof m.duration_s === "number") { durations.push(m.duration_s); if (durations.length > 20) durations.shift(); }
  if (typeof m.reward_mean === "number") document.getElementById("run-latest").textContent = m.reward_mean.toFixed(3);
  if (typeof msg.steps_done === "number") state.stepsDone = msg.steps_done;
  renderStatus();
}

// The run's place in the fair queue while it waits for a GPU worker; a message with no place: out of it.
function showQueue(msg) {
  const line = document.getElementById("run-queue");
  if (!line) return;
  line.hidden = msg.place == null;
  line.querySelector("[data-queue-reason]").textContent = msg.reason || "";
}

function onMessage(msg) {
  live.messages += 1;
  switch (msg.type) {
    case "step": addStep(msg); break;
    case "status":
      state.actions = msg.actions ?? state.actions;
      applySummary(msg);
      break;
    case "summary": applySummary(msg); break;
    case "checkpoint": addCheckpoint(msg); break;
    case "event": addEvent(msg); break;
    case "log": addLog(msg); break;
    case "group": addGroup(msg); break;
    case "queue": showQueue(msg); break;
    default: break;
  }
}

applySummary(data.summary);
for (const g of data.groups || []) addGroup(g);
live.socket = new LiveSocket(data.ws_path, {
  onMessage,
  catchUp: () => ({
    type: "catch_up", after_step: state.lastStep, after_event: state.lastEvent, after_log: state.lastLog,
    after_group: state.lastGroup, pending_groups: pendingGroups(), checkpoints_since: data.checkpoints_since,
  }),
  onState: (s) => { live.state = s; showConnState(document.getElementById("live-state"))(s); },
});

// Plotly sizes a chart when it is drawn; charts drawn in a hidden tab need a resize when shown.
document.querySelector(".tabs")?.addEventListener("tabchange", () => {
  for (const c of charts) window.Plotly.Plots.resize(c.el);
});
