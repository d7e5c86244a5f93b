// The live overview (static/js/live.js): re-read every few seconds; the server renders (and escapes)
// its body, and the history charts (static/js/charts.js) are redrawn from the data in each copy.
(function () {
  "use strict";
  const body = document.getElementById("ops-body");
  if (!body) return;
  const LABELS = { rate_limited: "rate limited (429)", server_error: "provider error (5xx)", client_error: "rejected (4xx)",
    timeout: "timed out", malformed: "malformed answer", error: "other error", lost: "lost with its worker" };

  const PLOT_HEIGHT = 200; // px between the axes of each history chart, whatever its legend takes

  // `source`: the history's json_script, of the page or of a fresh copy (Live.swap drops scripts).
  function drawHistory(source) {
    if (!source || !document.getElementById("chart-ops-runs")) return;
    const h = JSON.parse(source.textContent);
    const x = h.buckets;
    const color = Charts.palette(Object.keys(h.latency_ms));
    const kinds = Charts.palette(Object.keys(h.runs).concat(Object.keys(h.error_rate), Object.keys(h.spend_usd_per_min)));
    const small = { height: PLOT_HEIGHT + 80, margin: { t: 36, b: 44 }, legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
      xaxis: { type: "date", title: "time (UTC)" } };
    const none = (el, text) => Charts.empty(el, text);

    if (!Object.keys(h.runs).length) none("chart-ops-runs", "No run finished in this period.");
    else Charts.plot("chart-ops-runs", Object.entries(h.runs).map(([kind, y]) => ({
      type: "bar", name: kind, x, y, marker: { color: kinds(kind) }, hovertemplate: "%{y} " + kind + " run(s)<extra></extra>",
    })), { ...small, showlegend: true, barmode: "stack", yaxis: { title: "runs per " + (h.bucket_s / 60) + " min" } });

    if (!Object.keys(h.error_rate).length) none("chart-ops-errors", "No provider error in this period.");
    else Charts.plot("chart-ops-errors", Object.entries(h.error_rate).map(([kind, y]) => ({
      type: "scatter", mode: "lines+markers", connectgaps: false, name: LABELS[kind] || kind, x, y, marker: { color: kinds(kind) },
      hovertemplate: "%{y:.1%} of calls: " + (LABELS[kind] || kind) + "<extra></extra>",
    })), { ...small, showlegend: true, yaxis: { title: "share of calls", tickformat: ".0%", rangemode: "tozero" } });

    // A dozen workers make a legend of several rows: the plot keeps its height and the chart grows.
    const workers = Object.entries(h.latency_ms);
    if (!workers.length) none("chart-ops-latency", "No successful call in this period.");
    else Charts.plot("chart-ops-latency", workers.flatMap(([w, p]) => [
      { type: "scatter", mode: "lines+markers", name: w, legendgroup: w, x, y: p.p95, line: { color: color(w) }, connectgaps: false,
        hovertemplate: "p95 %{y:.0f} ms: " + Charts.text(w) + "<extra></extra>" },
      { type: "scatter", mode: "lines", name: w + " p50", legendgroup: w, showlegend: false, x, y: p.p50, line: { color: color(w), dash: "dot" }, connectgaps: false,
        hovertemplate: "p50 %{y:.0f} ms: " + Charts.text(w) + "<extra></extra>" },
    ]), { ...small, showlegend: true, plotHeight: PLOT_HEIGHT, yaxis: { title: "ms", rangemode: "tozero" } });

    // Spend by what the runs were for, stacked: live traffic apart from shadow runs and training's.
    const spend = Object.entries(h.spend_usd_per_min).filter(([, y]) => y.some((v) => v > 0));
    if (!spend.length) none("chart-ops-spend", "Nothing spent in this period.");
    else Charts.plot("chart-ops-spend", spend.map(([kind, y]) => ({ type: "bar", name: kind, x, y, marker: { color: kinds(kind) },
      hovertemplate: "$%{y:.6f} per minute: " + kind + " runs<extra></extra>" })),
    { ...small, showlegend: true, barmode: "stack", yaxis: { title: "USD per minute", tickprefix: "$" } });
    Charts.ready();
  }

  window.__conductorOps = Live.follow({ // for tests and debugging
    source: body.dataset.partial,
    as: "html",
    every: Number(body.dataset.every) || 5000,
    badge: document.getElementById("ops-live"),
    apply(copy) {
      const history = copy.getElementById("ops-history-data");
      Live.swap(body, copy.body);
      drawHistory(history);
      return false;
    },
  });
  drawHistory(document.getElementById("ops-history-data"));
})();
