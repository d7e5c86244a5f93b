// One module for the charts of every page (analytics, a training job's curves, an evaluation, the
// workflow graph): Plotly's shared layout and config, one colour per name, the empty state, and the
// page's "charts drawn" mark (document.body.dataset.chartsReady) once every chart has rendered.
// Data comes from json_script blocks or JSON responses and reaches Plotly as data, never as HTML.
window.Charts = (function () {
  "use strict";
  // The legend sits above the plot, clear of the x axis's ticks and title (below, it covered them).
  const base = {
    margin: { l: 60, r: 20, t: 10, b: 50 }, height: 320, paper_bgcolor: "#fff", plot_bgcolor: "#fff",
    legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom" },
  };
  const config = { displayModeBar: false, responsive: true };
  const PALETTE = ["#2456c7", "#e07b00", "#1d7a3e", "#b42318", "#6f42c1", "#00838f", "#9a6700", "#c2185b", "#546e7a", "#7cb342", "#5d4037"];
  const drawn = [];

  // The layout of every chart: the shared base with this chart's own settings over it. An axis title
  // may be given as a string: plotly.js 3 and later draw only {text: ...} (a string is silently dropped).
  function layout(own) {
    const out = { ...base, ...own, margin: { ...base.margin, ...(own && own.margin) } };
    Object.keys(out).filter((k) => /^[xy]axis\d*$/.test(k)).forEach((k) => {
      if (typeof out[k].title === "string") out[k] = { ...out[k], title: { text: out[k].title } };
    });
    return out;
  }

  // One colour per name across every chart of a page, so a worker looks the same everywhere.
  function palette(names) {
    const sorted = [...new Set(names)].sort();
    return (name) => PALETTE[Math.max(0, sorted.indexOf(name)) % PALETTE.length];
  }

  function empty(target, text) {
    const el = typeof target === "string" ? document.getElementById(target) : target;
    if (el.data) Plotly.purge(el);
    el.classList.add("empty");
    el.textContent = text;
  }

  // Untrusted text (an error a provider sent) for a label or hover text: Plotly reads a few HTML tags
  // in those, so <, > and & go in as entities, which it shows as the characters themselves.
  function text(value) {
    return Live.visible(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  // Text positions for labelled points, taken in turn along the x axis (above, below, ...), so that
  // neighbours' labels do not print over each other.
  function alternate(xs, ...positions) {
    const order = xs.map((x, i) => [Number(x), i]).sort((a, b) => a[0] - b[0]);
    const out = new Array(xs.length);
    order.forEach(([, i], k) => { out[i] = positions[k % positions.length]; });
    return out;
  }

  // Draw (or redraw in place) a chart; the page's ready mark waits for it.
  function plot(target, traces, own) {
    const el = typeof target === "string" ? document.getElementById(target) : target;
    el.classList.remove("empty");
    if (!el.data) el.textContent = "";
    const done = Plotly.react(el, traces, layout(own), config);
    drawn.push(done);
    return done;
  }

  // Mark the page once the charts drawn so far have rendered.
  function ready() {
    return Promise.all(drawn).then(() => { document.body.dataset.chartsReady = "1"; });
  }

  return { config, layout, palette, empty, plot, ready, text, alternate };
})();
