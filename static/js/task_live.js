// The task page follows its run live. The websocket of the graph page (/ws/tasks/<id>/) only says
// "something changed"; on each event (and on every (re)connect, which may have missed some) the page
// fetches a fresh copy of itself and swaps in the parts that change: the status badge and #task-body
// (totals, final answer, error, runs, plans, steps). PostgreSQL stays the source of truth and the
// server renders (and escapes) every piece of data: nothing here builds markup from data, and text
// set here goes in through textContent. When the task is finished the socket is closed.
(function () {
  "use strict";
  const body = document.getElementById("task-body");
  const badge = document.getElementById("task-live");
  if (!body || !badge) return;
  const taskId = body.dataset.task;
  const FINISHED = new Set(["succeeded", "failed"]);
  const COALESCE_MS = 150; // events come in bursts (a step ends, the next starts): one re-read each
  const BACKOFF_MS = [1000, 2000, 4000, 8000, 15000, 30000];
  const state = { status: body.dataset.status, socket: null, failures: 0, refreshes: 0, inFlight: false, again: false, timer: null, finished: false, events: 0, opens: 0, refreshFailures: 0 };
  window.__conductorTaskLive = state; // for tests and debugging

  function show(name, text) {
    badge.dataset.state = name;
    badge.textContent = text;
  }

  function schedule() {
    if (state.finished) return;
    if (state.inFlight) { state.again = true; return; } // one re-read at a time, the latest wins
    if (state.timer === null) state.timer = setTimeout(() => { state.timer = null; refresh(); }, COALESCE_MS);
  }

  async function refresh() {
    state.inFlight = true;
    state.again = false;
    try {
      const response = await fetch(location.pathname, { credentials: "same-origin", headers: { Accept: "text/html" }, cache: "no-store" });
      // A redirect means the session is gone (the login page): keep the page as it is.
      if (!response.ok || response.redirected) throw new Error("HTTP " + response.status);
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      apply(fresh);
      state.refreshFailures = 0;
    } catch (err) {
      if (!state.finished) {
        show("error", "update failed");
        // Try again a few times, further apart; after that the next event (or reconnect) will.
        if (state.refreshFailures < BACKOFF_MS.length) setTimeout(schedule, BACKOFF_MS[state.refreshFailures]);
        state.refreshFailures += 1;
      }
    } finally {
      state.inFlight = false;
      if (state.again) schedule();
    }
  }

  function apply(fresh) {
    const newBody = fresh.getElementById("task-body");
    const newStatus = fresh.getElementById("task-status");
    if (!newBody || newBody.dataset.task !== taskId || !newStatus) throw new Error("not this task's page");
    newBody.querySelectorAll("script").forEach((s) => s.remove()); // never any: the server escapes data
    // Keep open what the reader opened.
    const open = new Set(Array.from(body.querySelectorAll("details[open][data-key]"), (d) => d.dataset.key));
    newBody.querySelectorAll("details[data-key]").forEach((d) => { if (open.has(d.dataset.key)) d.open = true; });
    body.replaceChildren(...Array.from(newBody.childNodes).map((n) => document.adoptNode(n)));
    body.dataset.status = newBody.dataset.status;
    const status = document.getElementById("task-status");
    status.className = newStatus.className;
    status.textContent = newStatus.textContent;
    state.status = newBody.dataset.status;
    state.refreshes += 1;
    if (FINISHED.has(state.status)) finish();
    else if (state.socket && state.socket.readyState === WebSocket.OPEN) show("live", "live");
  }

  function finish() {
    state.finished = true;
    if (state.timer !== null) { clearTimeout(state.timer); state.timer = null; }
    show("finished", "finished");
    if (state.socket) state.socket.close(1000);
  }

  function connect() {
    if (state.finished) return;
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + "/ws/tasks/" + encodeURIComponent(taskId) + "/");
    state.socket = socket;
    socket.onopen = () => {
      state.failures = 0;
      state.opens += 1;
      show("live", "live");
      schedule(); // whatever happened before this socket was open
    };
    socket.onmessage = () => { state.events += 1; schedule(); };
    socket.onclose = (ev) => {
      if (state.socket !== socket || state.finished) return;
      state.socket = null;
      if (ev.code === 4403 || ev.code === 4404) { show("offline", "not live"); return; } // refused: retrying will not help
      const base = BACKOFF_MS[Math.min(state.failures, BACKOFF_MS.length - 1)];
      state.failures += 1;
      show("reconnecting", "reconnecting…");
      setTimeout(connect, base + Math.floor(Math.random() * base * 0.2));
    };
  }

  if (FINISHED.has(state.status)) finish();
  else connect();
})();
