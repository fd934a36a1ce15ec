// A run's fields as the pages render them on the server (templates/training/_status.html, the run page's
// summary, the runs list's rows), for the live updates of the same fields.

// The status badge: the status itself, except "waiting", a client-driven run between its ART client's
// training jobs, whose label (training.models.Run.Status) says what it waits for.
const LABELS = { waiting: "waiting for its client" };

export function showStatus(badge, status) {
  badge.textContent = LABELS[status] || status;
  badge.className = `badge status-${status}`;
}

// A reward, to three decimals ("—" for none), as the templates' floatformat:3.
export function fixed3(x) {
  return typeof x === "number" ? x.toFixed(3) : "—";
}

// A time from the server (ISO 8601 in its time zone: training.services.broadcast._when) as the templates
// print it: its wall clock to the minute, "2025-05-01 14:03"; `none` (text or a node) when there is none.
export function showWhen(cell, iso, none) {
  if (!iso) return cell.replaceChildren(none);
  const time = document.createElement("time");
  time.dateTime = iso;
  time.textContent = `${iso.slice(0, 10)} ${iso.slice(11, 16)}`;
  cell.replaceChildren(time);
}
