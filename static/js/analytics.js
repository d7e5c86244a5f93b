// Draws the analytics charts (static/js/charts.js) from the data the server embedded (json_script).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("analytics-data").textContent);
  const color = Charts.palette([].concat(...Object.values(data).map((rows) => rows.map((r) => r.worker || r.vendor || r.conductor || r.name))));

  // Bars one time bucket wide (an hour or a day: the server's grain, on the chart's element), centred
  // in their bucket: with a single bucket Plotly would otherwise draw a bar a millisecond wide and an
  // axis of milliseconds. The legend is always shown, so a single series is named.
  function stacked(id, rows, key, value, yTitle) {
    if (!rows.length) return Charts.empty(id, "No steps in this period. Submit tasks or widen the period.");
    const grain = Number(document.getElementById(id).dataset.bucketS) * 1000;
    const mid = (r) => new Date(Date.parse(r.bucket) + grain / 2).toISOString();
    const groups = [...new Set(rows.map((r) => r[key]))];
    const traces = groups.map((g) => {
      const mine = rows.filter((r) => r[key] === g);
      return {
        type: "bar", name: g, x: mine.map(mid), y: mine.map((r) => Number(r[value])), width: mine.map(() => grain * 0.9),
        marker: { color: color(g) },
      };
    });
    const starts = rows.map((r) => Date.parse(r.bucket));
    const range = [Math.min(...starts) - grain, Math.max(...starts) + 2 * grain].map((t) => new Date(t).toISOString());
    Charts.plot(id, traces, { barmode: "stack", showlegend: true, xaxis: { type: "date", range }, yaxis: { title: yTitle } });
  }

  stacked("chart-cost-worker", data.cost_by_worker, "worker", "cost_usd", "USD");
  stacked("chart-volume-vendor", data.cost_by_vendor, "vendor", "steps", "steps");
  stacked("chart-cost-conductor", data.cost_by_conductor, "conductor", "cost_usd", "USD");

  const workers = data.accuracy_cost_workers, conductors = data.accuracy_cost_conductors;
  if (!workers.length && !conductors.length) {
    Charts.empty("chart-pareto", "No scored runs in this period: submit tasks with a reference answer.");
  } else {
    // One trace per point, named in the legend with its n (one shadow run at accuracy 0 reads as n=1)
    // and described on hover: labels printed beside the points overlapped wherever points crowd.
    const point = (r, group, symbol) => ({
      type: "scatter", mode: "markers", name: Charts.text(r.name) + " (n=" + r.runs + ")",
      legendgroup: group, legendgrouptitle: { text: group }, x: [Number(r.usd_per_1000)], y: [r.accuracy],
      marker: { size: 12, symbol, color: color(r.name), line: { width: r.pareto ? 3 : 0, color: "#1d2330" } },
      hovertext: [Charts.text(r.name) + ": accuracy " + r.accuracy.toFixed(3) + ", " + Charts.dollars(Number(r.usd_per_1000))
        + " per 1,000 tasks (" + r.runs + " runs)" + (r.pareto ? ", on the Pareto front" : "")],
      hoverinfo: "text",
    });
    const all = [...workers, ...conductors];
    const front = all.filter((r) => r.pareto).sort((a, b) => a.usd_per_1000 - b.usd_per_1000);
    Charts.plot("chart-pareto", [
      ...workers.map((r) => point(r, "final worker", "circle")),
      ...conductors.map((r) => point(r, "conductor version", "diamond")),
      { type: "scatter", mode: "lines", name: "Pareto front", x: front.map((r) => Number(r.usd_per_1000)), y: front.map((r) => r.accuracy), line: { dash: "dot", color: "#8a93a3" }, hoverinfo: "skip" },
    ], { xaxis: { title: "USD per 1,000 tasks", type: "log", ...Charts.dollarTicks(all.map((r) => Number(r.usd_per_1000))) },
      yaxis: { title: "accuracy", range: [0, 1.1] }, showlegend: true, plotHeight: 240 });
  }

  const routing = data.routing_by_domain;
  if (!routing.length) {
    Charts.empty("chart-routing", "No steps in this period.");
  } else {
    const workersAll = [...new Set(routing.map((r) => r.worker))];
    const domains = [...new Set(routing.map((r) => r.domain))];
    Charts.plot("chart-routing", workersAll.map((w) => ({
      type: "bar", orientation: "h", name: w, y: domains, marker: { color: color(w) },
      x: domains.map((d) => { const r = routing.find((x) => x.domain === d && x.worker === w); return r ? r.share : 0; }),
    })), { barmode: "stack", xaxis: { title: "share of steps", tickformat: ".0%" }, margin: { l: 110 } });
  }
  Charts.ready();
})();
