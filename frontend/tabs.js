// Accessible tabs (WAI-ARIA pattern): arrow keys move between tabs, Home/End jump, and the open tab
// is kept in the URL hash so a reload or a shared link opens the same one.

export function initTabs(root) {
  const tabs = [...root.querySelectorAll('[role="tab"]')];
  if (!tabs.length) return;
  const select = (tab, focus = true) => {
    for (const t of tabs) {
      const on = t === tab;
      t.setAttribute("aria-selected", String(on));
      t.tabIndex = on ? 0 : -1;
      document.getElementById(t.getAttribute("aria-controls")).hidden = !on;
    }
    if (focus) tab.focus();
    history.replaceState(null, "", "#" + tab.id.replace(/^tab-/, ""));
    root.dispatchEvent(new CustomEvent("tabchange", { detail: { id: tab.id } }));
  };
  tabs.forEach((tab, i) => {
    tab.addEventListener("click", () => select(tab));
    tab.addEventListener("keydown", (e) => {
      const moves = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 };
      if (e.key in moves) {
        e.preventDefault();
        select(tabs[(moves[e.key] + tabs.length) % tabs.length]);
      }
    });
  });
  const fromHash = tabs.find((t) => t.id === "tab-" + location.hash.slice(1));
  select(fromHash || tabs[0], false);
}

for (const root of document.querySelectorAll(".tabs")) initTabs(root);
