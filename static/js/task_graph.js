// Live workflow graph. The REST API is the source of truth; the task's websocket only says "something
// changed", and the page re-reads the task over the API (static/js/live.js: coalesced, one read at a
// time, reconnect with backoff) and redraws. lastSeq is the run's audit sequence as last read.
(function () {
  "use strict";
  const graph = document.getElementById("graph");
  const panel = document.getElementById("node-panel");
  const runStatus = document.getElementById("run-status");
  const taskId = graph.dataset.task;
  const visible = Live.visible;
  const COLORS = { pending: "#c9ced6", running: "#2456c7", succeeded: "#1d7a3e", failed: "#b42318", skipped: "#9a6700" };
  const graphState = { task: null, run: null, lastSeq: 0, steps: new Map(), selected: null };
  // The page lays the graph out and sets its axes' ranges on every draw: a double click must not reset
  // them. Plotly counts any two clicks within its doubleClickDelay (500 ms) as one, so a quick click on
  // one node and then another would reset the axes to the ranges of the page's first draw (an empty
  // run's) before the second click is read: the node moves away from under the pointer (often out of
  // the plot) and the click selects nothing.
  const config = Object.assign({}, Charts.config, { doubleClick: false });

  // The legend of the status colours, from the colours themselves.
  document.getElementById("graph-legend").replaceChildren(...Object.entries(COLORS).map(([status, color]) => {
    const item = document.createElement("li");
    const dot = document.createElement("span");
    dot.className = "dot";
    dot.style.background = color;
    item.append(dot, document.createTextNode(status));
    return item;
  }));

  function latestRun(task) {
    const runs = (task.runs || []).filter((r) => r.kind === "live" || r.kind === "retry");
    return runs.length ? runs[0] : (task.runs || [])[0] || null;
  }

  function apply(task, state) {
    state.task = task;
    state.run = latestRun(task);
    state.lastSeq = state.run ? state.run.audit_seq : 0;
    draw();
    return false; // a finished task can still get a retry run: keep following
  }

  function deps(step) {
    return step.sees || []; // the server's one rule of what a step sees (routing.plans.visible_indices)
  }

  // Layered layout, in plot units (one unit between layers and between rows). A step's layer is one
  // more than its deepest dependency; the steps of a layer stack downwards, conductor steps last (so
  // the line to their nested plan runs down past no other node). Each level of recursion is a band of
  // its own below the band above it; a nested plan sits in a frame under the conductor step that
  // produced it, its last layer under that step (or to the right, past a sibling plan of that level).
  const G = {
    labelBelow: 0.62, // a node's centre to the bottom of its label
    nodeAbove: 0.34, // a node's centre to just above its marker
    channel: 0.42, // an edge that skips layers runs this far above its plan's top row...
    channelStep: 0.16, // ...and this much higher for each further layer it skips
    padX: 0.45, // a frame's margin left and right of its outermost nodes
    padY: 0.16, // and above its highest line, below its lowest label
    gap: 0.5, // between the bands of two levels
    siblingGap: 0.3, // between two frames side by side in one band
    pxPerUnit: 64, // vertical scale: the plot grows taller as the bands add up
  };

  function arrange(steps) {
    const layer = new Map();
    steps.forEach((s) => layer.set(s.index, deps(s).reduce((m, d) => Math.max(m, (layer.get(d) ?? -1) + 1), 0)));
    const rows = new Map();
    const order = steps.slice().sort((a, b) => (a.worker_slug === "conductor") - (b.worker_slug === "conductor") || a.index - b.index);
    const rel = new Map();
    order.forEach((s) => {
      const l = layer.get(s.index);
      const row = rows.get(l) || 0;
      rows.set(l, row + 1);
      rel.set(s.id, { l, row });
    });
    let span = 1;
    steps.forEach((s) => deps(s).forEach((d) => { span = Math.max(span, layer.get(s.index) - (layer.get(d) ?? 0)); }));
    const above = span > 1 ? G.channel + G.channelStep * (span - 2) : G.nodeAbove;
    return { rel, layers: Math.max(0, ...layer.values()) + 1, rows: Math.max(1, ...rows.values()), above };
  }

  function layout(run) {
    const byDecision = new Map();
    run.steps.forEach((s) => { if (!byDecision.has(s.decision)) byDecision.set(s.decision, []); byDecision.get(s.decision).push(s); });
    const decisions = new Map(run.decisions.map((d) => [d.id, d]));
    const pos = new Map();
    const frames = [];
    const root = run.decisions.filter((d) => d.parent_step === null && d.valid).pop();
    let level = root ? [{ decision: root, conductor: null }] : [];
    let bottom = 0; // the lowest point drawn so far
    while (level.length) {
      const plans = level.map((p) => ({ ...p, steps: (byDecision.get(p.decision.id) || []).sort((a, b) => a.index - b.index) }))
        .filter((p) => p.steps.length)
        .map((p) => ({ ...p, shape: arrange(p.steps) }));
      if (!plans.length) break;
      const nested = plans[0].conductor !== null;
      const above = Math.max(...plans.map((p) => p.shape.above));
      const top = nested ? bottom - G.gap - G.padY - above : 0; // the y of this band's top row
      plans.sort((a, b) => (a.conductor ? pos.get(a.conductor.id).x : 0) - (b.conductor ? pos.get(b.conductor.id).x : 0));
      let cursor = -Infinity; // the right edge of the last frame placed in this band
      const next = [];
      plans.forEach((p) => {
        const want = p.conductor ? Math.max(0, pos.get(p.conductor.id).x - (p.shape.layers - 1)) : 0;
        const x0 = Math.max(want, cursor + G.siblingGap + G.padX);
        p.steps.forEach((s) => { const r = p.shape.rel.get(s.id); pos.set(s.id, { x: x0 + r.l, y: top - r.row, row: r.row, top, step: s }); });
        const x1 = x0 + p.shape.layers - 1;
        const low = top - (p.shape.rows - 1) - G.labelBelow;
        if (nested) {
          frames.push({ x0: x0 - G.padX, x1: x1 + G.padX, y0: low - G.padY, y1: top + above + G.padY, conductor: p.conductor });
          bottom = Math.min(bottom, low - G.padY);
        } else {
          bottom = Math.min(bottom, low);
        }
        cursor = x1 + G.padX;
        p.steps.forEach((s) => {
          const child = run.decisions.find((d) => d.parent_step === s.id && d.valid);
          if (child) next.push({ decision: child, conductor: s });
        });
      });
      level = next;
    }
    return { pos, decisions, frames, bottom };
  }

  function fmtCost(v) { return "$" + Number(v || 0).toFixed(6); }

  function draw() {
    const run = state.run;
    if (!run) { runStatus.textContent = "No run yet."; return; }
    runStatus.textContent = "Run " + run.id + ": " + run.status + (run.error ? " — " + visible(run.error) : "") +
      " · " + fmtCost(run.cost_usd) + " · " + run.input_tokens + " / " + run.output_tokens + " tokens";
    const { pos, frames, bottom } = layout(run);
    state.steps = new Map(run.steps.map((s) => [s.id, s]));
    const edgeX = [], edgeY = [], nestX = [], nestY = [], arrows = [];
    run.steps.forEach((s) => {
      const to = pos.get(s.id); if (!to) return;
      run.steps.filter((o) => o.decision === s.decision && deps(s).includes(o.index)).forEach((o) => {
        const from = pos.get(o.id); if (!from) return;
        // An edge that skips layers would run straight behind the nodes in between and vanish: it
        // runs above the plan's top row instead, from the gap after its layer to the gap before the
        // step that sees. A node in a lower row reaches that gap sideways (rising straight from it
        // would cross the nodes stacked above it); a node in the top row, straight from its rim.
        const span = Math.round(to.x - from.x);
        if (span > 1) {
          const y = to.top + G.channel + G.channelStep * (span - 2);
          const path = [[from.x, from.y]];
          if (from.row) path.push([from.x + 0.5, from.y]);
          path.push([from.x + 0.5, y], [to.x - 0.5, y]);
          if (to.row) path.push([to.x - 0.5, to.y]);
          path.push([to.x, to.y]);
          path.forEach(([x, yy]) => { edgeX.push(x); edgeY.push(yy); });
          edgeX.push(null); edgeY.push(null);
        } else { edgeX.push(from.x, to.x, null); edgeY.push(from.y, to.y, null); }
        const last = span > 1 ? { x: to.x - 0.5, y: to.row ? to.y : to.top + G.channel + G.channelStep * (span - 2) } : from;
        // The arrowhead: towards the step that sees, stopping at its node's rim.
        arrows.push({ x: to.x, y: to.y, ax: last.x, ay: last.y, xref: "x", yref: "y", axref: "x", ayref: "y", text: "",
          showarrow: true, arrowhead: 2, arrowsize: 1.2, arrowwidth: 2, arrowcolor: "#8a93a3", standoff: 18, startstandoff: span > 1 ? 0 : 18 });
      });
    });
    const nodes = Array.from(pos.values());
    const traces = [
      { x: edgeX, y: edgeY, mode: "lines", line: { color: "#8a93a3", width: 2 }, hoverinfo: "skip", name: "sees" },
      { x: nestX, y: nestY, mode: "lines", line: { color: "#8a93a3", width: 1.5, dash: "dot" }, hoverinfo: "skip", name: "nested plan" },
      {
        x: nodes.map((n) => n.x), y: nodes.map((n) => n.y), mode: "markers+text", name: "steps",
        marker: { size: 34, color: nodes.map((n) => COLORS[n.step.status] || "#999"), line: { width: nodes.map((n) => (n.step.id === state.selected ? 4 : 1)), color: "#1d2330" } },
        text: nodes.map((n) => (n.step.depth ? n.step.depth + "." : "") + n.step.index + " " + n.step.worker_slug),
        textposition: "bottom center",
        customdata: nodes.map((n) => n.step.id),
        hovertext: nodes.map((n) => n.step.worker_slug + " · " + n.step.status + "<br>" + n.step.input_tokens + " / " + n.step.output_tokens + " tokens · " + fmtCost(n.step.cost_usd) + (n.step.latency_ms != null ? " · " + n.step.latency_ms + " ms" : "")),
        hoverinfo: "text",
      },
    ];
    // A nested plan's frame, and a dotted line down to it from below the conductor step's label.
    const shapes = frames.map((f) => ({ type: "rect", layer: "below", xref: "x", yref: "y", x0: f.x0, x1: f.x1, y0: f.y0, y1: f.y1,
      fillcolor: "#f6f8fb", line: { color: "#b8bfcc", width: 1, dash: "dot" } }));
    frames.forEach((f) => {
      const c = pos.get(f.conductor.id); if (!c) return;
      const x = Math.min(Math.max(c.x, f.x0 + 0.25), f.x1 - 0.25), mid = f.y1 + G.gap / 2;
      // Another conductor step stacked below this one: leave sideways, by the gap after the layer.
      const blocked = Array.from(pos.values()).some((o) => o.step.decision === c.step.decision && o.x === c.x && o.y < c.y);
      if (blocked) { nestX.push(c.x, c.x + 0.5, c.x + 0.5); nestY.push(c.y, c.y, mid); }
      else { nestX.push(c.x, c.x); nestY.push(c.y - G.labelBelow, mid); }
      nestX.push(x, x, null); nestY.push(mid, f.y1, null);
    });
    const xs = nodes.map((n) => n.x), ys = nodes.map((n) => n.y);
    const top = Math.max(0, ...edgeY.filter((y) => y !== null));
    const yRange = [Math.min(Math.min(0, ...ys) - 0.8, bottom - 0.2), top + 0.6];
    const layoutSpec = {
      showlegend: false, margin: { l: 20, r: 20, t: 10, b: 10 }, plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff",
      height: Math.max(440, Math.round((yRange[1] - yRange[0]) * G.pxPerUnit) + 20),
      xaxis: { visible: false, range: [Math.min(0, ...xs, ...frames.map((f) => f.x0 + 0.6)) - 0.6, Math.max(1, ...xs, ...frames.map((f) => f.x1 - 0.6)) + 0.9] },
      yaxis: { visible: false, range: yRange },
      annotations: arrows, shapes,
    };
    Plotly.react(graph, traces, layoutSpec, config);
    RunTimeline.draw("timeline", run);
    graph.dataset.nodes = String(nodes.length);
    graph.dataset.runStatus = run.status;
    if (!graph.__clickBound) {
      graph.on("plotly_click", (ev) => { const id = ev.points[0] && ev.points[0].customdata; if (id) select(id); });
      graph.__clickBound = true;
    }
    if (state.selected) renderPanel(state.steps.get(state.selected));
  }

  function el(tag, text, cls) { const e = document.createElement(tag); if (text != null) e.textContent = visible(text); if (cls) e.className = cls; return e; }

  function select(stepId) { state.selected = stepId; draw(); }

  function renderPanel(step) {
    panel.replaceChildren();
    if (!step) { panel.append(el("p", "Select a step.", "muted")); return; }
    panel.append(el("h3", "Step " + (step.depth ? step.depth + "." : "") + step.index + " · " + step.worker_slug));
    panel.append(el("p", step.status + " · " + (step.vendor || "no vendor") + " · " + fmtCost(step.cost_usd) + " · " + step.input_tokens + " / " + step.output_tokens + " tokens", "muted"));
    panel.append(el("h4", "Instruction"), el("pre", step.instruction, "text"));
    if (step.messages_sent) {
      panel.append(el("h4", "What it was shown"));
      step.messages_sent.forEach((m) => { panel.append(el("div", m.role, "muted"), el("pre", m.content, "text shown")); });
    }
    if (step.response) panel.append(el("h4", "Response"), el("pre", step.response, "text response"));
    if (step.note) panel.append(el("p", step.note, "muted"));
    if (step.error) panel.append(el("p", step.error, "error"));
    if (step.attempts && step.attempts.length) {
      panel.append(el("h4", "Attempts"));
      const list = el("ol");
      step.attempts.forEach((a) => list.append(el("li", a.status + (a.http_status ? " (HTTP " + a.http_status + ")" : "") + " · " + (a.latency_ms ?? "–") + " ms · " + fmtCost(a.cost_usd) + (a.error ? " · " + a.error : ""))));
      panel.append(list);
    }
  }

  // For tests and debugging: the live state (socket, events, latencies) with the graph's own.
  const state = Object.assign(Live.follow({
    source: graph.dataset.api, as: "json", socket: "/ws/tasks/" + encodeURIComponent(taskId) + "/",
    badge: document.getElementById("live-state"), readNow: true,
    apply: (task) => apply(task, state),
  }), graphState);
  window.__conductorGraph = state;
})();
