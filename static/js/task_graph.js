// Live workflow graph. The REST API is the source of truth; the websocket only says "something
// changed" with a gap-free sequence number per run. A gap, a reconnect or a new plan means: re-read.
(function () {
  "use strict";
  const graph = document.getElementById("graph");
  const panel = document.getElementById("node-panel");
  const liveState = document.getElementById("live-state");
  const runStatus = document.getElementById("run-status");
  const taskId = graph.dataset.task;
  const api = graph.dataset.api;
  const COLORS = { pending: "#c9ced6", running: "#2456c7", succeeded: "#1d7a3e", failed: "#b42318", skipped: "#9a6700" };
  const state = { task: null, run: null, lastSeq: 0, steps: new Map(), selected: null, socket: null, reloads: 0, latencies: [] };
  window.__conductorGraph = state; // for tests and debugging

  function latestRun(task) {
    const runs = (task.runs || []).filter((r) => r.kind === "live" || r.kind === "retry");
    return runs.length ? runs[0] : (task.runs || [])[0] || null;
  }

  async function reload() {
    const mine = (state.reloads += 1);
    const response = await fetch(api, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) { runStatus.textContent = "Could not load the task (" + response.status + ")."; return; }
    const task = await response.json();
    if (mine !== state.reloads) return; // a newer re-read is on its way: never draw an older state over it
    state.task = task;
    state.run = latestRun(state.task);
    state.lastSeq = state.run ? state.run.audit_seq : 0;
    draw();
  }

  function deps(step) {
    if (step.access === "all") return Array.from({ length: step.index }, (_, i) => i);
    return Array.isArray(step.access) ? step.access : [];
  }

  // Layered layout: a step's layer is one more than its deepest dependency; nested plans sit below
  // the conductor step that produced them, shifted right, one band per level of recursion.
  function layout(run) {
    const byDecision = new Map();
    run.steps.forEach((s) => { if (!byDecision.has(s.decision)) byDecision.set(s.decision, []); byDecision.get(s.decision).push(s); });
    const decisions = new Map(run.decisions.map((d) => [d.id, d]));
    const pos = new Map();
    function place(decisionId, originX, originY) {
      const steps = (byDecision.get(decisionId) || []).sort((a, b) => a.index - b.index);
      const layer = new Map();
      const rows = new Map();
      steps.forEach((s) => {
        const l = deps(s).reduce((m, d) => Math.max(m, (layer.get(d) ?? -1) + 1), 0);
        layer.set(s.index, l);
        const row = rows.get(l) || 0;
        rows.set(l, row + 1);
        pos.set(s.id, { x: originX + l, y: originY - row, step: s });
      });
      steps.forEach((s) => {
        const child = run.decisions.find((d) => d.parent_step === s.id && d.valid);
        if (child) { const p = pos.get(s.id); place(child.id, p.x + 0.35, p.y - 1.4); }
      });
    }
    const root = run.decisions.filter((d) => d.parent_step === null && d.valid).pop();
    if (root) place(root.id, 0, 0);
    return { pos, decisions };
  }

  function fmtCost(v) { return "$" + Number(v || 0).toFixed(6); }

  function draw() {
    const run = state.run;
    if (!run) { runStatus.textContent = "No run yet."; return; }
    runStatus.textContent = "Run " + run.id + ": " + run.status + (run.error ? " — " + run.error : "") +
      " · " + fmtCost(run.cost_usd) + " · " + run.input_tokens + " / " + run.output_tokens + " tokens";
    const { pos } = layout(run);
    state.steps = new Map(run.steps.map((s) => [s.id, s]));
    const edgeX = [], edgeY = [], nestX = [], nestY = [], arrows = [];
    run.steps.forEach((s) => {
      const to = pos.get(s.id); if (!to) return;
      run.steps.filter((o) => o.decision === s.decision && deps(s).includes(o.index)).forEach((o) => {
        const from = pos.get(o.id); if (!from) return;
        // An edge that skips layers would run straight behind the nodes in between and vanish: bend it.
        const span = Math.round(to.x - from.x);
        const bend = span > 1 ? { x: (from.x + to.x) / 2, y: Math.max(from.y, to.y) + 0.3 * (span - 1) } : null;
        const last = bend || from;
        if (bend) { edgeX.push(from.x, bend.x, to.x, null); edgeY.push(from.y, bend.y, to.y, null); }
        else { edgeX.push(from.x, to.x, null); edgeY.push(from.y, to.y, null); }
        // The arrowhead: towards the step that sees, stopping at its node's rim.
        arrows.push({ x: to.x, y: to.y, ax: last.x, ay: last.y, xref: "x", yref: "y", axref: "x", ayref: "y", text: "",
          showarrow: true, arrowhead: 2, arrowsize: 1.2, arrowwidth: 2, arrowcolor: "#8a93a3", standoff: 18, startstandoff: bend ? 0 : 18 });
      });
      const parent = run.decisions.find((d) => d.id === s.decision && d.parent_step);
      if (parent) { const p = pos.get(parent.parent_step); if (p) { nestX.push(p.x, to.x, null); nestY.push(p.y, to.y, null); } }
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
    const xs = nodes.map((n) => n.x), ys = nodes.map((n) => n.y);
    const top = Math.max(0, ...edgeY.filter((y) => y !== null));
    const layoutSpec = {
      showlegend: false, margin: { l: 20, r: 20, t: 10, b: 10 }, height: 440, plot_bgcolor: "#ffffff", paper_bgcolor: "#ffffff",
      xaxis: { visible: false, range: [Math.min(0, ...xs) - 0.6, Math.max(1, ...xs) + 0.9] },
      yaxis: { visible: false, range: [Math.min(0, ...ys) - 0.8, top + 0.6] },
      annotations: arrows,
    };
    Plotly.react(graph, traces, layoutSpec, { displayModeBar: false, responsive: true });
    graph.dataset.nodes = String(nodes.length);
    graph.dataset.runStatus = run.status;
    if (!graph.__clickBound) {
      graph.on("plotly_click", (ev) => { const id = ev.points[0] && ev.points[0].customdata; if (id) select(id); });
      graph.__clickBound = true;
    }
    if (state.selected) renderPanel(state.steps.get(state.selected));
  }

  function el(tag, text, cls) { const e = document.createElement(tag); if (text != null) e.textContent = text; if (cls) e.className = cls; return e; }

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

  function onEvent(event) {
    if (!state.run || event.run !== state.run.id || event.seq <= state.lastSeq) {
      if (!state.run || event.run !== state.run.id) reload();
      return; // an old or repeated event
    }
    if (event.seq !== state.lastSeq + 1) { reload(); return; } // a gap: re-read, never guess
    state.lastSeq = event.seq;
    const step = event.object === "step" ? state.steps.get(Number(event.id)) : null;
    if (step && (event.action === "step.started" || event.action === "step.succeeded" || event.action === "step.failed")) {
      if (event.action === "step.started") { step.status = "running"; draw(); return; }
    }
    reload(); // finished steps, plans and run ends carry content the event does not: read it
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/tasks/" + taskId + "/");
    state.socket = socket;
    socket.onopen = () => { liveState.textContent = "live"; liveState.className = "status status-succeeded"; reload(); };
    socket.onmessage = (msg) => {
      const event = JSON.parse(msg.data);
      if (event.sent_at) state.latencies.push(Date.now() / 1000 - event.sent_at); // commit to this page, seconds
      onEvent(event);
    };
    socket.onclose = () => {
      liveState.textContent = "reconnecting…"; liveState.className = "status status-queued";
      setTimeout(connect, 1000);
    };
  }

  reload().then(connect);
})();
