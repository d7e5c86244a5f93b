// How every live page follows the server: one mechanism, used by the task page, the workflow graph,
// the overview, a training job and an evaluation.
//
// Something says "changed": an event on the page's websocket, or, where a page has none, a timer.
// The page then re-reads its source (its own HTML or a JSON endpoint) and applies the copy. Bursts
// coalesce into one read, one read runs at a time and the latest wins, a failed read is retried
// further apart, a dropped socket reconnects with backoff (and re-reads, since it may have missed
// events), and following stops once the page says it is finished. PostgreSQL stays the source of
// truth and the server renders and escapes every piece of data: an event only triggers a read.
//
//   Live.follow({
//     source: "/url" or () => "/url",   what to re-read
//     as: "html" | "json",              parsed with DOMParser, or as JSON
//     apply(copy, state) -> bool,       show the copy; return true when there is nothing left to follow
//     socket: "/ws/...",                optional: re-read on its events
//     every: ms,                        optional: re-read this long after the last read (no socket, or a backstop)
//     badge: element,                   optional: shows connecting / live / reconnecting / finished
//     readNow: bool,                    read at once (else on the socket's open, or after `every`)
//   }) -> state (exposed for tests: reads, events, opens, socket, latencies, finished)
window.Live = (function () {
  "use strict";
  const COALESCE_MS = 150; // events come in bursts (a step ends, the next starts): one read each
  const BACKOFF_MS = [1000, 2000, 4000, 8000, 15000, 30000];
  const LABELS = { connecting: "connecting…", live: "live", reconnecting: "reconnecting…", error: "update failed", offline: "not live", finished: "finished" };

  // Bidi and zero-width characters shown as ⟨U+XXXX⟩, as the server-rendered pages show them (the
  // display template filters); a zero-width joiner between two emoji is how that emoji is written, kept.
  const EMOJI = "[\\u00a9\\u00ae\\u203c\\u2049\\u2122\\u2139\\u2194-\\u21ff\\u231a-\\u23ff\\u24c2\\u25aa-\\u27bf\\u2934\\u2935\\u2b05-\\u2b55\\u3030\\u303d\\u3297\\u3299\\u{1f000}-\\u{1faff}]";
  const CONTROLS = new RegExp(
    "(?<=" + EMOJI + "[\\ufe0f\\u{1f3fb}-\\u{1f3ff}]?)(\\u200d)(?=" + EMOJI + ")" + // a joiner of two emoji
    "|[\\u202a-\\u202e\\u2066-\\u2069\\u200e\\u200f\\u061c\\u200b-\\u200d\\u2060\\ufeff]", "gu");
  function visible(text) {
    return String(text).replace(CONTROLS, (c, joiner) =>
      joiner ? c : "\u27e8U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "\u27e9");
  }

  const followed = []; // every follow of this page: [options, state]

  // True when no follow of this page is reading or about to: each socket is open (or given up) and has
  // been read since it opened, and no read is in flight or queued. Tests (and the sweep) wait for it
  // before they click or leave, so that no redraw or request is cut short.
  function settled() {
    return followed.every(([options, state]) => state.finished || (!state.inFlight && state.timer === null
      && (!options.socket || (state.socket !== null && state.socket.readyState === WebSocket.OPEN && state.reads > 0)
        || (options.badge && ["offline", "error"].includes(options.badge.dataset.state)))
      && (!options.readNow || state.reads > 0)));
  }

  function follow(options) {
    const state = {
      finished: false, socket: null, failures: 0, readFailures: 0, reads: 0, events: 0, opens: 0,
      latencies: [], inFlight: false, again: false, timer: null, poll: null,
    };
    const badge = options.badge || null;
    followed.push([options, state]);

    function show(name) {
      if (!badge || badge.dataset.state === name) return;
      badge.dataset.state = name;
      badge.textContent = LABELS[name];
    }

    function schedule() {
      if (state.finished) return;
      if (state.inFlight) { state.again = true; return; } // one read at a time, the latest wins
      if (state.timer === null) state.timer = setTimeout(() => { state.timer = null; read(); }, COALESCE_MS);
    }

    async function read() {
      state.inFlight = true;
      state.again = false;
      if (state.poll !== null) { clearTimeout(state.poll); state.poll = null; }
      let next = options.every || null; // when to read again unless something says so first
      try {
        const url = typeof options.source === "function" ? options.source() : options.source;
        const response = await fetch(url, {
          credentials: "same-origin", cache: "no-store",
          headers: { Accept: options.as === "json" ? "application/json" : "text/html" },
        });
        // A redirect means the session is gone (the login page): keep the page as it is.
        if (!response.ok || response.redirected) throw new Error("HTTP " + response.status);
        const copy = options.as === "json" ? await response.json()
          : new DOMParser().parseFromString(await response.text(), "text/html");
        const done = await options.apply(copy, state);
        state.reads += 1;
        state.readFailures = 0;
        if (done) finish();
        else if (!state.socket || state.socket.readyState === WebSocket.OPEN) show("live");
      } catch (err) {
        if (!state.finished) {
          show("error");
          // Try again a few times, further apart; after that the next event, reconnect or tick will.
          next = state.readFailures < BACKOFF_MS.length ? Math.max(next || 0, BACKOFF_MS[state.readFailures]) : next;
          state.readFailures += 1;
        }
      } finally {
        state.inFlight = false;
        if (state.again) schedule();
        else if (next !== null && !state.finished) state.poll = setTimeout(schedule, next);
      }
    }

    function finish() {
      state.finished = true;
      if (state.timer !== null) { clearTimeout(state.timer); state.timer = null; }
      if (state.poll !== null) { clearTimeout(state.poll); state.poll = null; }
      show("finished");
      if (state.socket) state.socket.close(1000);
    }

    function connect() {
      if (state.finished) return;
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      const socket = new WebSocket(scheme + location.host + options.socket);
      state.socket = socket;
      socket.onopen = () => {
        state.failures = 0;
        state.opens += 1;
        show("live");
        schedule(); // whatever happened before this socket was open
      };
      socket.onmessage = (message) => {
        state.events += 1;
        try {
          const event = JSON.parse(message.data);
          if (event.sent_at) state.latencies.push(Date.now() / 1000 - event.sent_at); // commit to this page, seconds
        } catch (err) { /* an event only triggers a read: its content is never needed */ }
        schedule();
      };
      socket.onclose = (ev) => {
        if (state.socket !== socket || state.finished) return;
        state.socket = null;
        if (ev.code === 4403 || ev.code === 4404) { show("offline"); return; } // refused: retrying will not help
        const base = BACKOFF_MS[Math.min(state.failures, BACKOFF_MS.length - 1)];
        state.failures += 1;
        show("reconnecting");
        setTimeout(connect, base + Math.floor(Math.random() * base * 0.2));
      };
    }

    // A page without a socket was just rendered by the server: it is as fresh as a read.
    show(options.socket ? "connecting" : "live");
    if (options.socket) connect();
    if (options.readNow) schedule();
    else if (!options.socket && options.every) state.poll = setTimeout(schedule, options.every);
    return state;
  }

  // Keep open what the reader opened when a fresh copy replaces a part of the page.
  function swap(target, fresh) {
    fresh.querySelectorAll("script").forEach((s) => s.remove()); // never any: the server escapes data
    const open = new Set(Array.from(target.querySelectorAll("details[open][data-key]"), (d) => d.dataset.key));
    fresh.querySelectorAll("details[data-key]").forEach((d) => { if (open.has(d.dataset.key)) d.open = true; });
    target.replaceChildren(...Array.from(fresh.childNodes).map((n) => document.adoptNode(n)));
    Object.keys(fresh.dataset).forEach((k) => { target.dataset[k] = fresh.dataset[k]; });
  }

  return { follow, settled, swap, visible };
})();
