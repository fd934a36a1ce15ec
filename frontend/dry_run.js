// Dry run page: poll the status until the worker finishes, then reload to show the trajectories.
const waiting = document.getElementById("dry-run-waiting");
const badge = document.getElementById("dry-run-status");

async function poll(delay) {
  try {
    const response = await fetch(waiting.dataset.statusUrl, { headers: { Accept: "application/json" } });
    if (response.ok) {
      const body = await response.json();
      badge.textContent = body.status;
      badge.className = `badge status-${body.status}`;
      if (body.waiting) waiting.textContent = body.waiting;
      if (body.finished) { location.reload(); return; }
    }
  } catch (_) { /* server restarting: keep polling */ }
  setTimeout(() => poll(Math.min(delay * 1.5, 5000)), delay);
}

if (waiting) setTimeout(() => poll(1000), 1000);
