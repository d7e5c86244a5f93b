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

  // An amount of USD as a tick or hover text shows it: "$0.005", "$0.50", "$2", "$1,000".
  function dollars(value) {
    if (value >= 1) return "$" + value.toLocaleString("en-US", { maximumFractionDigits: 2 });
    if (value >= 0.01) return "$" + value.toFixed(2);
    return "$" + value.toPrecision(1);
  }

  // A log axis of dollars over these values: ticks at 1, 2 and 5 times each power of ten within its
  // range, each labelled as an amount (Plotly's own log ticks label 2 and 5 as bare digits), and a
  // range a little wider than the values. Values of zero or less cannot sit on a log axis.
  function dollarTicks(values) {
    const positive = values.filter((v) => v > 0);
    if (!positive.length) return {};
    const low = Math.min(...positive) / 1.6, high = Math.max(...positive) * 1.6;
    const tickvals = [];
    for (let e = Math.floor(Math.log10(low)); e <= Math.ceil(Math.log10(high)); e++) {
      [1, 2, 5].forEach((m) => {
        const v = m * Math.pow(10, e);
        if (v >= low && v <= high) tickvals.push(Number(v.toPrecision(1)));
      });
    }
    return { range: [Math.log10(low), Math.log10(high)], tickmode: "array", tickvals, ticktext: tickvals.map(dollars) };
  }

  // Draw (or redraw in place) a chart; the page's ready mark waits for it. `own.plotHeight`: the
  // height of the plot area between its axes, kept whatever the legend takes (a legend of a dozen
  // names runs to several rows, which would otherwise squeeze the plot into a strip): the chart
  // grows by the legend's rows instead. A redraw starts from the height the chart last had.
  function plot(target, traces, own) {
    const el = typeof target === "string" ? document.getElementById(target) : target;
    el.classList.remove("empty");
    if (!el.data) el.textContent = "";
    const { plotHeight, ...rest } = own || {};
    const fixed = plotHeight && el._fullLayout && el._fullLayout.height ? { height: el._fullLayout.height } : {};
    let done = Plotly.react(el, traces, layout({ ...rest, ...fixed }), config);
    if (plotHeight) done = done.then(() => keepPlotHeight(el, plotHeight, 3));
    drawn.push(done);
    return done;
  }

  // Grow (or shrink) the chart until its plot area is `height` px: Plotly caps the margin a legend
  // may push at a share of the chart's height, so a tall legend may take more than one step.
  function keepPlotHeight(el, height, tries) {
    const off = height - el._fullLayout._size.h;
    if (Math.abs(off) < 1 || !tries) return Promise.resolve(el);
    return Plotly.relayout(el, { height: el._fullLayout.height + off }).then(() => keepPlotHeight(el, height, tries - 1));
  }

  // Mark the page once the charts drawn so far have rendered.
  function ready() {
    return Promise.all(drawn).then(() => { document.body.dataset.chartsReady = "1"; });
  }

  return { config, layout, palette, empty, plot, ready, text, alternate, dollars, dollarTicks };
})();
