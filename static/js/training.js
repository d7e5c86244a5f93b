// ML staff's training pages: the launch form's backend switch, a job's live curves, an evaluation's chart.
// Data comes from json_script blocks or JSON responses; it is written with textContent, never as HTML.
(function () {
  "use strict";
  // Bidi and zero-width characters shown as ⟨U+XXXX⟩, as the server-rendered pages show them.
  const CONTROLS = /[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\u200b-\u200d\u2060\ufeff]/g;
  const visible = (text) => String(text).replace(CONTROLS,
    (c) => "\u27e8U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "\u27e9");
  const base = { margin: { l: 60, r: 20, t: 10, b: 50 }, height: 340, paper_bgcolor: "#fff", plot_bgcolor: "#fff", legend: { orientation: "h" } };
  const config = { displayModeBar: false, responsive: true };

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

  // --- A job's page: progress and curves that grow while it runs. -------------------------------
  const jobData = document.getElementById("job-data");
  if (jobData) {
    const state = JSON.parse(jobData.textContent);
    const curves = document.getElementById("job-curves");
    const bar = document.getElementById("job-progress");
    const traces = {}; // metric key -> trace index
    let lastStep = -1;
    let drawing = Promise.resolve();

    const MONEY = /usd|cost/i;
    const numeric = (v) => typeof v === "number" && Number.isFinite(v);

    // Plot the new points: extend the traces that exist, add a trace for a key seen for the first time.
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
      drawing = drawing.then(() => {
        const known = Object.keys(fresh).filter((k) => k in traces);
        const added = Object.keys(fresh).filter((k) => !(k in traces)).sort();
        const steps = [];
        if (known.length) {
          steps.push(() => Plotly.extendTraces(curves, { x: known.map((k) => fresh[k].x), y: known.map((k) => fresh[k].y) }, known.map((k) => traces[k])));
        }
        if (added.length) {
          steps.push(() => {
            const start = curves.data.length;
            added.forEach((k, i) => { traces[k] = start + i; });
            // Money is on its own axis, on the right: dollars per 1,000 tasks dwarf rewards and losses.
            return Plotly.addTraces(curves, added.map((k) => ({
              type: "scatter", mode: "lines+markers", name: k, x: fresh[k].x, y: fresh[k].y, yaxis: MONEY.test(k) ? "y2" : "y",
            })));
          });
        }
        return steps.reduce((p, step) => p.then(step), Promise.resolve());
      });
    }

    function show(s) {
      const percent = Math.round(s.progress * 1000) / 10;
      bar.value = percent;
      bar.setAttribute("aria-valuenow", String(percent));
      const status = document.getElementById("job-status");
      status.textContent = s.status_label || s.status;
      status.className = "status status-" + s.status;
      document.getElementById("job-step").textContent = s.step + "/" + s.total_steps;
      const log = document.getElementById("job-log");
      const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.textContent = visible(s.log_tail);
      if (atBottom) log.scrollTop = log.scrollHeight;
      const error = document.getElementById("job-error");
      error.textContent = visible(s.error || "");
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

    function poll() {
      fetch(state.progress_url + "?after=" + encodeURIComponent(lastStep), { headers: { Accept: "application/json" }, credentials: "same-origin" })
        .then((r) => { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
        .then((s) => {
          addPoints(s.metrics);
          show(s);
          if (!s.finished) setTimeout(poll, 1000);
        })
        .catch(() => setTimeout(poll, 3000)); // the server restarting: try again, more slowly
    }

    drawing = Plotly.newPlot(curves, [], {
      ...base, margin: { ...base.margin, r: 70 }, xaxis: { title: "step" }, yaxis: { title: "value" },
      yaxis2: { title: "USD", overlaying: "y", side: "right", showgrid: false },
    }, config);
    addPoints(state.metrics);
    drawing.then(() => { document.body.dataset.curvesReady = "1"; });
    show(state);
    if (!state.finished) setTimeout(poll, 1000);
  }

  // --- An evaluation's page: candidate and baseline on accuracy vs cost. -------------------------
  const evalData = document.getElementById("evaluation-data");
  if (evalData) {
    const points = JSON.parse(evalData.textContent);
    const chart = document.getElementById("evaluation-chart");
    if (!points.length) {
      chart.classList.add("empty");
      chart.textContent = "No results yet.";
      document.body.dataset.chartsReady = "1";
    } else {
      const colors = { candidate: "#2456c7", baseline: "#8a93a3" };
      Plotly.newPlot(chart, points.map((p) => ({
        type: "scatter", mode: "markers+text", name: p.side + ": " + p.name,
        x: [Number(p.usd_per_1000)], y: [p.accuracy], text: [p.name], textposition: "top center", cliponaxis: false,
        marker: { size: 14, color: colors[p.side] || "#1d2330", symbol: p.side === "candidate" ? "diamond" : "circle" },
        hovertext: [p.name + ": accuracy " + Number(p.accuracy).toFixed(3) + ", $" + Number(p.usd_per_1000).toFixed(4) + " per 1,000 tasks"
          + (p.n != null ? ", n = " + p.n + (p.total != null && p.total !== p.n ? " of " + p.total + " done" : "") : "")], hoverinfo: "text",
      })), { ...base, xaxis: { title: "USD per 1,000 tasks", rangemode: "tozero" }, yaxis: { title: "accuracy", range: [0, 1.05] } }, config)
        .then(() => { document.body.dataset.chartsReady = "1"; });
    }
    const summary = document.getElementById("evaluation-summary");
    if (summary && summary.dataset.refresh === "1") setTimeout(() => window.location.reload(), 3000);
  }
})();
