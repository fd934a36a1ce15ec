// Playground and answer diff pages: follow a queued job until it is done, then reload to show it;
// on the playground, a token's log-probability and the other candidates show on hover (or focus).
const waiting = document.getElementById("job-waiting");
const badge = document.getElementById("job-status");

async function poll(delay) {
  try {
    const response = await fetch(waiting.dataset.statusUrl, { headers: { Accept: "application/json" } });
    if (response.ok) {
      const body = await response.json();
      if (badge) { badge.textContent = body.status; badge.className = `badge status-${body.status}`; }
      if (body.status === "done" || body.status === "failed") { location.reload(); return; }
    }
  } catch (_) { /* server restarting: keep polling */ }
  setTimeout(() => poll(Math.min(delay * 1.5, 5000)), delay);
}

if (waiting) setTimeout(() => poll(1000), 1000);

const tip = document.getElementById("logprob-tip");

function show(event) {
  const tok = event.target.closest(".tok");
  if (!tok || !tip) return;
  const logprob = Number(tok.dataset.logprob);
  const lines = [`${JSON.stringify(tok.textContent)}  logprob ${logprob.toFixed(3)}  p=${Math.exp(logprob).toFixed(3)}`];
  for (const line of (tok.dataset.top || "").split("\n").filter(Boolean)) {
    const [text, lp] = line.split("\t");
    lines.push(`  ${JSON.stringify(text)}  ${Number(lp).toFixed(3)}`);
  }
  tip.textContent = lines.join("\n");
  const box = tok.getBoundingClientRect();
  tip.style.left = `${window.scrollX + box.left}px`;
  tip.style.top = `${window.scrollY + box.bottom + 4}px`;
  tip.hidden = false;
}

function hide(event) {
  if (tip && event.target.closest(".tok")) tip.hidden = true;
}

document.addEventListener("mouseover", show);
document.addEventListener("focusin", show);
document.addEventListener("mouseout", hide);
document.addEventListener("focusout", hide);

// Colour each token by its probability: sure tokens plain, unlikely ones highlighted.
for (const tok of document.querySelectorAll(".tok")) {
  const p = Math.exp(Number(tok.dataset.logprob));
  if (Number.isFinite(p)) tok.style.backgroundColor = `rgba(222, 111, 47, ${((1 - p) * 0.45).toFixed(3)})`;
}
