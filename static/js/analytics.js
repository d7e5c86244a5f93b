// Draws the analytics charts from the data the server embedded (json_script: safely escaped).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("analytics-data").textContent);
  const base = { margin: { l: 60, r: 20, t: 10, b: 50 }, height: 320, paper_bgcolor: "#fff", plot_bgcolor: "#fff", legend: { orientation: "h" } };
  const config = { displayModeBar: false, responsive: true };
  // One colour per name across every chart, so a worker looks the same everywhere.
  const PALETTE = ["#2456c7", "#e07b00", "#1d7a3e", "#b42318", "#6f42c1", "#00838f", "#9a6700", "#c2185b", "#546e7a", "#7cb342", "#5d4037"];
  const names = [...new Set([].concat(...Object.values(data).map((rows) => rows.map((r) => r.worker || r.vendor || r.conductor || r.name))))].sort();
  const color = (name) => PALETTE[names.indexOf(name) % PALETTE.length];
  const drawn = []; // Plotly draws asynchronously: the page is ready when every chart is
  const plot = (...args) => drawn.push(Plotly.newPlot(...args));

  function empty(id, text) {
    const el = document.getElementById(id);
    el.classList.add("empty");
    el.textContent = text;
  }

  function stacked(id, rows, key, value, yTitle) {
    if (!rows.length) return empty(id, "No steps in this period. Submit tasks or widen the period.");
    const groups = [...new Set(rows.map((r) => r[key]))];
    const traces = groups.map((g) => {
      const mine = rows.filter((r) => r[key] === g);
      return { type: "bar", name: g, x: mine.map((r) => r.bucket), y: mine.map((r) => Number(r[value])), marker: { color: color(g) } };
    });
    plot(id, traces, { ...base, barmode: "stack", yaxis: { title: yTitle } }, config);
  }

  stacked("chart-cost-worker", data.cost_by_worker, "worker", "cost_usd", "USD");
  stacked("chart-volume-vendor", data.cost_by_vendor, "vendor", "steps", "steps");
  stacked("chart-cost-conductor", data.cost_by_conductor, "conductor", "cost_usd", "USD");

  const workers = data.accuracy_cost_workers, conductors = data.accuracy_cost_conductors;
  if (!workers.length && !conductors.length) {
    empty("chart-pareto", "No scored runs in this period: submit tasks with a reference answer.");
  } else {
    const point = (rows, name, symbol) => ({
      type: "scatter", mode: "markers+text", name, x: rows.map((r) => Number(r.usd_per_1000)), y: rows.map((r) => r.accuracy),
      text: rows.map((r) => r.name), textposition: "top center", cliponaxis: false,
      marker: { size: 12, symbol, line: { width: rows.map((r) => (r.pareto ? 3 : 0)), color: "#1d2330" } },
      hovertext: rows.map((r) => r.name + ": accuracy " + r.accuracy.toFixed(3) + ", $" + Number(r.usd_per_1000).toFixed(2) + " per 1,000 tasks (" + r.runs + " runs)"),
      hoverinfo: "text",
    });
    const front = [...workers, ...conductors].filter((r) => r.pareto).sort((a, b) => a.usd_per_1000 - b.usd_per_1000);
    plot("chart-pareto", [
      point(workers, "final worker", "circle"),
      point(conductors, "conductor version", "diamond"),
      { type: "scatter", mode: "lines", name: "Pareto front", x: front.map((r) => Number(r.usd_per_1000)), y: front.map((r) => r.accuracy), line: { dash: "dot", color: "#8a93a3" }, hoverinfo: "skip" },
    ], { ...base, xaxis: { title: "USD per 1,000 tasks", type: "log" }, yaxis: { title: "accuracy", range: [0, 1.05] } }, config);
  }

  const routing = data.routing_by_domain;
  if (!routing.length) {
    empty("chart-routing", "No steps in this period.");
  } else {
    const workersAll = [...new Set(routing.map((r) => r.worker))];
    const domains = [...new Set(routing.map((r) => r.domain))];
    plot("chart-routing", workersAll.map((w) => ({
      type: "bar", orientation: "h", name: w, y: domains, marker: { color: color(w) },
      x: domains.map((d) => { const r = routing.find((x) => x.domain === d && x.worker === w); return r ? r.share : 0; }),
    })), { ...base, barmode: "stack", xaxis: { title: "share of steps", tickformat: ".0%" }, margin: { ...base.margin, l: 110 } }, config);
  }
  Promise.all(drawn).then(() => { document.body.dataset.chartsReady = "1"; });
})();
