// A run's status badge, as the pages render it on the server (templates/training/_status.html): the
// status itself, except "waiting", a client-driven run between its ART client's training jobs, whose
// label (training.models.Run.Status) says what it waits for.
const LABELS = { waiting: "waiting for its client" };

export function showStatus(badge, status) {
  badge.textContent = LABELS[status] || status;
  badge.className = `badge status-${status}`;
}
