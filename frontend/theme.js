// Dark mode toggle. The page head already applied a stored choice before first paint; this wires the
// button and tells charts to restyle through a "themechange" event on document.

const KEY = "artweb-theme";

export function currentTheme() {
  const forced = document.documentElement.dataset.theme;
  if (forced) return forced;
  return window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

function apply(theme) {
  document.documentElement.dataset.theme = theme;
  try { localStorage.setItem(KEY, theme); } catch (_) { /* private mode: session only */ }
  document.dispatchEvent(new CustomEvent("themechange", { detail: { theme } }));
}

export function initThemeToggle(button) {
  if (!button) return;
  const label = () => {
    const dark = currentTheme() === "dark";
    button.setAttribute("aria-pressed", String(dark));
    button.textContent = dark ? "Light mode" : "Dark mode";
  };
  button.addEventListener("click", () => { apply(currentTheme() === "dark" ? "light" : "dark"); label(); });
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
    if (!document.documentElement.dataset.theme) {
      document.dispatchEvent(new CustomEvent("themechange", { detail: { theme: currentTheme() } }));
    }
    label();
  });
  label();
}

initThemeToggle(document.getElementById("theme-toggle"));
