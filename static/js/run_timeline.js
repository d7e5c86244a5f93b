// A run's timeline: a waterfall on a time axis, as trace viewers show spans. One row for the run,
// one per plan the conductor wrote (its planning time), one per step, nested plans' steps indented
// under the conductor step that called them. A step's bar spans its whole life; its attempts sit on
// it as narrower bars, so retries (and the waits between them) and steps running side by side show.
// Drawn from the same task JSON the graph re-reads (static/js/live.js), with static/js/charts.js.
window.RunTimeline = (function () {
  "use strict";
  const STEP = { pending: "#e4e7ec", running: "#c9d6f2", succeeded: "#cfe6d6", failed: "#f2d0cc", skipped: "#f0e2bf" };
  // Attempts by outcome (routing.models.Attempt.Status): success, the kinds a retry may follow, and the rest.
  const ATTEMPT = { succeeded: "#1d7a3e", rate_limited: "#e07b00", timeout: "#9a6700", server_error: "#b42318", client_error: "#c2185b",
    malformed: "#6f42c1", error: "#7a1c14", lost: "#8a93a3", started: "#2456c7" };
  const PLAN = "#6f42c1";

  const ms = (iso) => (iso ? Date.parse(iso) : null);
  const fmtMs = (v) => (v >= 1000 ? (v / 1000).toFixed(2) + " s" : Math.round(v) + " ms");
  const fmtCost = (v) => "$" + Number(v || 0).toFixed(6);

  // The rows, top to bottom: depth-first through plans, so a nested plan's steps sit under its caller.
  function rows(run) {
    const out = [];
    const stepsOf = new Map();
    run.steps.forEach((s) => { if (!stepsOf.has(s.decision)) stepsOf.set(s.decision, []); stepsOf.get(s.decision).push(s); });
    const childPlans = new Map();
    run.decisions.forEach((d) => { if (d.parent_step !== null) { if (!childPlans.has(d.parent_step)) childPlans.set(d.parent_step, []); childPlans.get(d.parent_step).push(d); } });
    const visit = (decision, indent) => {
      out.push({ kind: "plan", decision, indent, label: "\u2003".repeat(indent) + "plan" + (decision.depth ? " (depth " + decision.depth + ")" : "") + (decision.attempt > 1 ? " #" + decision.attempt : "") });
      (stepsOf.get(decision.id) || []).slice().sort((a, b) => a.index - b.index).forEach((s) => {
        out.push({ kind: "step", step: s, indent: indent + 1, label: "\u2003".repeat(indent + 1) + (s.depth ? s.depth + "." : "") + s.index + " " + s.worker_slug });
        (childPlans.get(s.id) || []).forEach((d) => visit(d, indent + 2));
      });
    };
    run.decisions.filter((d) => d.parent_step === null).forEach((d) => visit(d, 0));
    return out;
  }

  function draw(target, run) {
    const el = typeof target === "string" ? document.getElementById(target) : target;
    const t0 = ms(run.started_at) ?? ms(run.created_at);
    if (!run.started_at) {
      el.dataset.rows = "0";
      return Charts.empty(el, "The run has not started yet.");
    }
    const now = Date.now();
    const rel = (iso) => ((ms(iso) ?? now) - t0) / 1000; // seconds since the run started
    const list = rows(run);
    const labels = ["run " + run.id].concat(list.map((r) => r.label)); // row i is drawn at y = i
    const bars = {}; // trace name -> {x, base, y, color, hover, width}
    const add = (name, color, width, y, start, end, hover) => {
      const t = bars[name] || (bars[name] = { name, color, width, x: [], base: [], y: [], hover: [] });
      t.base.push(start); t.x.push(Math.max(end - start, 0.002)); t.y.push(y); t.hover.push(hover);
    };
    const runEnd = rel(run.finished_at);
    add("run", "#d7dbe2", 0.8, 0, 0, runEnd, "run " + run.id + " · " + run.status + " · " + fmtMs(runEnd * 1000) + " · " + fmtCost(run.cost_usd));
    list.forEach((r, i) => {
      const y = i + 1;
      if (r.kind === "plan") {
        const end = rel(r.decision.created_at); // a decision is written when its planning ends
        const start = Math.max(0, end - (r.decision.latency_ms || 0) / 1000);
        add("planning", PLAN, 0.6, y, start, end, "plan by " + Charts.text(r.decision.version_name) + " · " + fmtMs(r.decision.latency_ms || 0) + (r.decision.valid ? "" : " · invalid") + " · " + fmtCost(r.decision.cost_usd));
        return;
      }
      const s = r.step;
      if (!s.started_at) return; // pending: a row with no bar yet
      const start = rel(s.started_at), end = rel(s.finished_at);
      add("step " + s.status, STEP[s.status] || "#e4e7ec", 0.8, y, start, end,
        s.worker_slug + " · " + s.status + " · " + fmtMs((end - start) * 1000) + " · " + (s.attempts || []).length + " attempt(s) · " + fmtCost(s.cost_usd));
      (s.attempts || []).forEach((a) => {
        const as = rel(a.started_at), ae = a.finished_at ? rel(a.finished_at) : (s.finished_at ? end : rel(null));
        add("attempt " + a.status.replace(/_/g, " "), ATTEMPT[a.status] || "#546e7a", 0.36, y, as, ae,
          "attempt " + a.number + " · " + a.status + (a.http_status ? " (HTTP " + a.http_status + ")" : "") + " · " + fmtMs((ae - as) * 1000) + " · " + fmtCost(a.cost_usd) + (a.error ? " · " + Charts.text(a.error.slice(0, 120)) : ""));
      });
    });
    const traces = Object.values(bars).map((t) => ({
      type: "bar", orientation: "h", name: t.name, x: t.x, base: t.base, y: t.y, width: t.width,
      marker: { color: t.color, line: { width: 0 } }, hovertext: t.hover, hoverinfo: "text",
    }));
    el.dataset.rows = String(labels.length);
    el.dataset.attempts = String(run.steps.reduce((n, s) => n + (s.attempts || []).length, 0));
    return Charts.plot(el, traces, {
      barmode: "overlay", height: Math.max(200, 90 + labels.length * 26),
      margin: { l: 170, r: 20, t: 36, b: 44 },
      xaxis: { title: "seconds since the run started", rangemode: "tozero", zeroline: true },
      yaxis: { tickvals: labels.map((_, i) => i), ticktext: labels, range: [labels.length - 0.5, -0.5], zeroline: false, automargin: true },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    });
  }

  return { draw, rows };
})();
