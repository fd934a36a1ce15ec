// Metric charts on Plotly (window.Plotly, loaded from the server's copy of the plotly package).
//
// A MetricChart holds one chart's raw points and draws them, optionally with an exponential moving
// average (debiased, as TensorBoard's smoothing) over the raw line. Live points are appended with
// Plotly.extendTraces, so a new step costs O(1) drawing work rather than a redraw of 2,000 points.

const Plotly = window.Plotly;

// The chart list (id, title, series, band, markers, signal) comes with each page's data, from
// training/charts.py: the one place it is written.

// The longest a chart out of view waits to draw its new points when the browser stays busy (ms).
const IDLE_MS = 1000;

const PALETTE = ["#2f6fde", "#e4572e", "#29a36a", "#a05bd8", "#d4a017", "#17a2b8", "#d63384", "#6c757d"];

export function color(i) { return PALETTE[i % PALETTE.length]; }

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

export function baseLayout(title, empty = false) {
  const text = css("--text");
  const grid = css("--border");
  return {
    annotations: empty ? [{ text: "no data yet", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
                            font: { color: css("--muted"), size: 12 } }] : [],
    title: { text: title, font: { size: 13, color: text }, x: 0.02, xanchor: "left" },
    paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "rgba(0,0,0,0)",
    font: { color: text, size: 11 },
    margin: { l: 48, r: 12, t: 32, b: 34 },
    xaxis: { title: { text: "step" }, gridcolor: grid, zerolinecolor: grid, showticklabels: !empty },
    yaxis: { gridcolor: grid, zerolinecolor: grid, automargin: true, showticklabels: !empty },
    showlegend: false,
    hovermode: "x unified",
    uirevision: "keep", // zoom survives live updates and restyles
  };
}

export const PLOT_CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

// Debiased EMA, incrementally: feed values in x order.
export class Ema {
  constructor(weight) { this.w = weight; this.acc = 0; this.n = 0; }
  push(v) {
    if (this.w <= 0) return v;
    this.n += 1;
    this.acc = this.acc * this.w + (1 - this.w) * v;
    // Rounded to 12 digits: the debiasing leaves ~1e-16 noise on a constant series, which Plotly's
    // autorange would blow up into a spike.
    return Number((this.acc / (1 - Math.pow(this.w, this.n))).toPrecision(12));
  }
}

export class MetricChart {
  // spec: an entry of the chart list (training/charts.py); data: {x, y} and, for band charts, std: [...] aligned with x.
  constructor(el, spec, data, smoothing = 0) {
    this.el = el;
    this.spec = spec;
    this.x = [...(data.x || [])];
    this.y = [...(data.y || [])];
    this.std = spec.band ? [...(data.std || [])] : null;
    this.smoothing = smoothing;
    // Live points reach a chart out of view as data at once, and are drawn when the browser is next idle
    // (within IDLE_MS) or when the chart scrolls (or its tab switches) into view, whichever comes first.
    // Drawing is the costly part of a live update: the charts in view are drawn first, and a page of
    // fourteen 2,000-point charts stays quick to update, yet every chart shows every point.
    this.visible = true;
    this.stale = false;
    this.idle = null;
    if ("IntersectionObserver" in window) {
      new IntersectionObserver((entries) => {
        this.visible = entries[entries.length - 1].isIntersecting;
        if (this.visible && this.stale) this.draw();
      }).observe(el);
    }
    this.draw();
  }

  // Plotly keeps the arrays it is given and extendTraces grows them in place, so every trace gets
  // arrays of its own (sharing this.x would count each live point twice).
  traces() {
    const w = this.smoothing;
    const x = () => this.x.slice();
    const main = color(0);
    const emaY = new Ema(w), emaS = new Ema(w);
    const sy = this.y.map((v) => emaY.push(v));
    this.emaY = emaY;
    const out = [];
    if (this.std) {
      const ss = this.std.map((v) => emaS.push(v ?? 0));
      this.emaS = emaS;
      out.push({ x: x(), y: sy.map((v, i) => v - ss[i]), mode: "lines", line: { width: 0 }, hoverinfo: "skip", name: "−std" });
      out.push({ x: x(), y: sy.map((v, i) => v + ss[i]), mode: "lines", line: { width: 0 }, fill: "tonexty",
                 fillcolor: "rgba(47,111,222,0.18)", hoverinfo: "skip", name: "+std" });
    }
    // A series measured only some steps has markers; any trace of one point too, which a line alone
    // would leave invisible.
    const single = this.x.length === 1;
    const markers = this.spec.markers || single ? "lines+markers" : "lines";
    out.push({ x: x(), y: this.y.slice(), mode: markers, name: "raw", line: { color: main, width: 1 },
               opacity: w > 0 ? 0.3 : 1, marker: { size: single ? 7 : 4 }, hoverinfo: w > 0 ? "skip" : "x+y" });
    out.push({ x: x(), y: sy, mode: single ? "lines+markers" : "lines", name: "smoothed",
               line: { color: main, width: 2 }, marker: { size: 7 }, visible: w > 0 });
    return out;
  }

  draw() {
    this.stale = false;
    return Plotly.react(this.el, this.traces(), baseLayout(this.spec.title, this.x.length === 0), PLOT_CONFIG);
  }

  // Draw the points a chart out of view holds when the browser is next idle (or by IDLE_MS).
  drawWhenIdle() {
    if (this.idle !== null) return;
    const later = window.requestIdleCallback || ((fn) => setTimeout(fn, 50));
    this.idle = later(() => {
      this.idle = null;
      if (this.stale) this.draw();
    }, { timeout: IDLE_MS });
  }

  setSmoothing(w) { this.smoothing = w; return this.draw(); }

  // Append one point (x must be past the last one; the caller drops duplicates).
  append(x, y, std) {
    if (!this.visible) {
      this.x.push(x);
      this.y.push(y);
      if (this.std) this.std.push(std ?? 0);
      this.stale = true;
      this.drawWhenIdle();
      return null;
    }
    if (this.x.length <= 1 || this.stale) {
      // The first point (a redraw takes the "no data yet" note away), the second (the first one's marker
      // goes), or a chart with points not drawn yet: redraw.
      this.x.push(x);
      this.y.push(y);
      if (this.std) this.std.push(std ?? 0);
      return this.draw();
    }
    this.x.push(x);
    this.y.push(y);
    const sy = this.emaY.push(y);
    if (!this.std) {
      return Plotly.extendTraces(this.el, { x: [[x], [x]], y: [[y], [sy]] }, [0, 1]);
    }
    const s = std ?? 0;
    this.std.push(s);
    const ss = this.emaS.push(s);
    return Plotly.extendTraces(this.el, { x: [[x], [x], [x], [x]], y: [[sy - ss], [sy + ss], [y], [sy]] }, [0, 1, 2, 3]);
  }

  lastX() { return this.x.length ? this.x[this.x.length - 1] : null; }
}

// Redraw every chart when the theme flips (axis and text colours come from CSS variables).
export function restyleOnThemeChange(charts) {
  document.addEventListener("themechange", () => { for (const c of charts()) c.draw(); });
}
