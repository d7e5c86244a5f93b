// ML staff's training pages: the launch form's backend switch, a job's live curves, an evaluation's
// chart. Both follow the server with static/js/live.js and draw with static/js/charts.js. Data comes
// from json_script blocks or JSON responses; it is written with textContent, never as HTML.
(function () {
  "use strict";

  // --- The launch form: show the chosen backend's settings only. --------------------------------
  const backend = document.getElementById("id_job-backend");
  if (backend) {
    const sync = () => {
      document.querySelectorAll("#job-form fieldset[data-backend]").forEach((fs) => {
        fs.hidden = fs.dataset.backend !== backend.value;
      });
    };
    backend.addEventListener("change", sync);
    sync();
  }

  // --- The rollouts form: the chosen version's default temperature, as the field's placeholder. ----
  const version = document.getElementById("id_rollouts-version");
  const temperature = document.getElementById("id_rollouts-temperature");
  if (version && temperature && temperature.dataset.defaults) {
    const defaults = JSON.parse(temperature.dataset.defaults);
    const show = () => {
      const value = defaults[version.value];
      temperature.placeholder = value === undefined ? "the conductor's default" : `default: ${value}`;
    };
    version.addEventListener("change", show);
    show();
  }

  // --- A job's page: progress and curves that grow while it runs. -------------------------------
  const jobData = document.getElementById("job-data");
  if (jobData) {
    const state = JSON.parse(jobData.textContent);
    const curves = document.getElementById("job-curves");
    const bar = document.getElementById("job-progress");
    const charts = {}; // metric key -> its chart's element
    let lastStep = -1;
    let drawing = Promise.resolve();

    // Small multiples: one chart per metric, each with its own labelled axis and unit (rewards,
    // accuracy, dollars and losses never share an axis). A metric not listed gets its key as title.
    const METRICS = {
      reward: { title: "Mean reward", unit: "reward" },
      reward_std: { title: "Reward spread (std)", unit: "reward" },
      accuracy: { title: "Accuracy", unit: "share correct", tickformat: ".0%", range: [0, 1.05] },
      usd_per_1000: { title: "Cost", unit: "USD per 1,000 tasks", tickprefix: "$" },
      loss: { title: "Loss", unit: "loss" },
      kl: { title: "KL to the reference", unit: "nats" },
      learning_rate: { title: "Learning rate", unit: "learning rate", exponentformat: "e" },
      grad_norm: { title: "Gradient norm", unit: "L2 norm" },
    };
    const describe = (key) => METRICS[key] || { title: key.replace(/_/g, " "), unit: key };
    const ORDER = Object.keys(METRICS);
    const rank = (key) => (ORDER.includes(key) ? ORDER.indexOf(key) : ORDER.length);

    function chartFor(key) {
      if (charts[key]) return { el: charts[key], created: false };
      const d = describe(key);
      const figure = document.createElement("figure");
      figure.className = "curve";
      figure.dataset.metric = key;
      const caption = document.createElement("figcaption");
      caption.textContent = d.title;
      const el = document.createElement("div");
      el.className = "chart small";
      figure.append(caption, el);
      // Keep the charts in a fixed order: the known metrics first, as listed, then the others by name.
      const after = Array.from(curves.children).find((f) => rank(f.dataset.metric) > rank(key)
        || (rank(f.dataset.metric) === rank(key) && f.dataset.metric > key));
      curves.insertBefore(figure, after || null);
      charts[key] = el;
      curves.querySelectorAll(":scope > p.muted").forEach((n) => n.remove());
      return { el, created: true };
    }

    const numeric = (v) => typeof v === "number" && Number.isFinite(v);

    // Plot the new points: extend a metric's chart, or draw it the first time its key is seen.
    function addPoints(metrics) {
      if (!metrics.length) return;
      const fresh = {}; // key -> {x: [], y: []}
      for (const m of metrics) {
        lastStep = Math.max(lastStep, m.step);
        for (const [key, value] of Object.entries(m.values || {})) {
          if (!numeric(value)) continue;
          (fresh[key] = fresh[key] || { x: [], y: [] });
          fresh[key].x.push(m.step);
          fresh[key].y.push(value);
        }
      }
      drawing = drawing.then(() => Promise.all(Object.keys(fresh).sort().map((key) => {
        const { el, created } = chartFor(key);
        if (!created) return Plotly.extendTraces(el, { x: [fresh[key].x], y: [fresh[key].y] }, [0]);
        const d = describe(key);
        return Charts.plot(el, [{ type: "scatter", mode: "lines+markers", name: d.title, x: fresh[key].x, y: fresh[key].y,
          hovertemplate: "step %{x}: %{y}<extra></extra>" }], {
          height: 220, showlegend: false, margin: { l: 64, r: 12, t: 8, b: 44 },
          xaxis: { title: "step", rangemode: "tozero" },
          yaxis: { title: d.unit, tickformat: d.tickformat, tickprefix: d.tickprefix, exponentformat: d.exponentformat, range: d.range },
        });
      })));
    }

    function show(s) {
      const percent = Math.round(s.progress * 1000) / 10;
      bar.value = percent;
      bar.setAttribute("aria-valuenow", String(percent));
      const status = document.getElementById("job-status");
      status.textContent = s.status_label || s.status;
      status.className = "status status-" + s.status;
      document.getElementById("job-step").textContent = s.step + "/" + s.total_steps;
      // What the job does now: the banner follows the status, the phase says what runs after the last step.
      const banner = document.getElementById("job-banner");
      banner.textContent = s.banner;
      banner.dataset.status = s.status;
      const phase = document.getElementById("job-phase");
      phase.textContent = "· " + s.phase;
      phase.hidden = !s.phase;
      const log = document.getElementById("job-log");
      const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.textContent = Live.visible(s.log_tail);
      if (atBottom) log.scrollTop = log.scrollHeight;
      const error = document.getElementById("job-error");
      error.textContent = Live.visible(s.error || "");
      error.hidden = !s.error;
      if (s.artifact_path) document.getElementById("job-artifact-path").textContent = s.artifact_path;
      if (s.candidate) {
        const cell = document.getElementById("job-candidate");
        const link = document.createElement("a");
        link.href = s.candidate.url;
        link.textContent = s.candidate.name;
        cell.replaceChildren(link);
      } else if (s.candidate_note) {
        const note = document.createElement("span");
        note.className = "muted";
        note.textContent = s.candidate_note;
        document.getElementById("job-candidate").replaceChildren(note);
      }
      if (s.started_at) document.getElementById("job-started-at").textContent = s.started_at;
      if (s.finished_at) document.getElementById("job-finished-at").textContent = s.finished_at;
      if (s.artifacts && s.artifacts.length) {
        document.getElementById("job-artifacts").replaceChildren(...s.artifacts.map((f) => {
          const item = document.createElement("li");
          const link = document.createElement("a");
          link.href = f.url;
          link.textContent = f.name;
          const size = document.createElement("span");
          size.className = "muted";
          size.textContent = " " + (f.size >= 1024 ? (f.size / 1024).toFixed(1) + " KB" : f.size + " bytes");
          item.append(link, size);
          return item;
        }));
      }
      if (s.finished) {
        const cancel = document.getElementById("job-cancel");
        if (cancel) cancel.remove();
        document.body.dataset.jobFinished = "1";
      }
    }

    const waiting = document.createElement("p");
    waiting.className = "muted";
    waiting.textContent = "No points yet: a chart per metric appears with the job's first step.";
    curves.replaceChildren(waiting);
    addPoints(state.metrics);
    drawing.then(() => { document.body.dataset.curvesReady = "1"; });
    show(state);
    if (!state.finished) {
      window.__conductorJob = Live.follow({ // for tests and debugging
        source: () => state.progress_url + "?after=" + encodeURIComponent(lastStep),
        as: "json", every: 1000, badge: document.getElementById("job-live"),
        apply(s) { addPoints(s.metrics); show(s); return s.finished; },
      });
    }
  }

  // --- An evaluation's page: candidate and baseline on accuracy vs cost, followed until it finishes.
  const summary = document.getElementById("evaluation-summary");
  if (summary) {
    const chart = document.getElementById("evaluation-chart");
    const colors = { candidate: "#2456c7", baseline: "#8a93a3" };
    const draw = (points) => {
      if (!points.length) return Charts.empty(chart, "No results yet.");
      return Charts.plot(chart, points.map((p) => ({
        type: "scatter", mode: "markers+text", name: p.side + ": " + p.name,
        x: [Number(p.usd_per_1000)], y: [p.accuracy], text: [p.name], textposition: "top center", cliponaxis: false,
        marker: { size: 14, color: colors[p.side] || "#1d2330", symbol: p.side === "candidate" ? "diamond" : "circle" },
        hovertext: [p.name + ": accuracy " + Number(p.accuracy).toFixed(3) + ", $" + Number(p.usd_per_1000).toFixed(4) + " per 1,000 tasks"
          + (p.n != null ? ", n = " + p.n + (p.total != null && p.total !== p.n ? " of " + p.total + " done" : "") : "")], hoverinfo: "text",
      })), { height: 340, xaxis: { title: "USD per 1,000 tasks", rangemode: "tozero" }, yaxis: { title: "accuracy", range: [0, 1.05] } });
    };
    const points = (doc) => JSON.parse(doc.getElementById("evaluation-data").textContent);
    draw(points(document));
    Charts.ready();
    if (summary.dataset.refresh === "1") {
      window.__conductorEvaluation = Live.follow({ // for tests and debugging
        source: () => location.pathname, as: "html", every: 3000, badge: document.getElementById("evaluation-live"),
        apply(copy) {
          const fresh = copy.getElementById("evaluation-summary");
          if (!fresh) throw new Error("not this evaluation's page");
          Live.swap(summary, fresh);
          const comparison = document.getElementById("evaluation-comparison");
          const freshComparison = copy.getElementById("evaluation-comparison");
          if (comparison && freshComparison) Live.swap(comparison, freshComparison);
          draw(points(copy));
          return summary.dataset.refresh !== "1";
        },
      });
    }
  }

  // --- A learned job's operating points: the cross-validated frontier against the fixed workflows. ---
  const frontierData = document.getElementById("frontier-data");
  const frontierChart = document.getElementById("frontier-chart");
  if (frontierData && frontierChart) {
    const f = JSON.parse(frontierData.textContent);
    const usd = (v) => "$" + Number(v).toFixed(2) + " per 1,000 tasks";
    const best = f.points.filter((p) => p.on_frontier).sort((a, b) => a.usd_per_1000 - b.usd_per_1000);
    const off = f.points.filter((p) => !p.on_frontier);
    Charts.plot(frontierChart, [
      { type: "scatter", mode: "markers", name: "fixed workflows", x: f.fixed.map((p) => p.usd_per_1000), y: f.fixed.map((p) => p.accuracy),
        marker: { size: 7, color: "#8a93a3" }, hovertext: f.fixed.map((p) => Charts.text(p.workflow) + ": accuracy " + p.accuracy.toFixed(3) + ", " + usd(p.usd_per_1000)), hoverinfo: "text" },
      { type: "scatter", mode: "markers", name: "learned (off the frontier)", x: off.map((p) => p.usd_per_1000), y: off.map((p) => p.accuracy),
        marker: { size: 7, color: "#f2a7a8" }, hovertext: off.map((p) => "penalty " + p.cost_penalty_per_usd + ": accuracy " + p.accuracy.toFixed(3) + ", " + usd(p.usd_per_1000)), hoverinfo: "text" },
      { type: "scatter", mode: "lines+markers+text", name: "learned frontier", x: best.map((p) => p.usd_per_1000), y: best.map((p) => p.accuracy),
        text: best.map((p) => "λ=" + p.cost_penalty_per_usd), textposition: Charts.alternate(best.map((p) => p.usd_per_1000), "top left", "bottom right"), line: { color: "#d62728" }, marker: { size: 10, color: "#d62728", symbol: "star" },
        hovertext: best.map((p) => "penalty " + p.cost_penalty_per_usd + ": accuracy " + p.accuracy.toFixed(3) + ", " + usd(p.usd_per_1000)), hoverinfo: "text" },
    ], { height: 380, xaxis: { title: "USD per 1,000 tasks (log scale)", type: "log", dtick: "D2", tickprefix: "$" }, yaxis: { title: "accuracy" } });
    Charts.ready();
  }
})();
