// The task page follows its run live (static/js/live.js): on each event of the task's websocket it
// re-reads itself and swaps in the parts that change: the status badge and #task-body (totals, final
// answer, error, runs, plans, steps). Following stops, and the socket closes, when the task is finished.
(function () {
  "use strict";
  const body = document.getElementById("task-body");
  const badge = document.getElementById("task-live");
  if (!body || !badge) return;
  const taskId = body.dataset.task;
  const FINISHED = new Set(["succeeded", "failed"]);

  window.__conductorTaskLive = Live.follow({ // for tests and debugging
    source: () => location.pathname,
    as: "html",
    socket: "/ws/tasks/" + encodeURIComponent(taskId) + "/",
    badge,
    apply(copy) {
      const freshBody = copy.getElementById("task-body");
      const freshStatus = copy.getElementById("task-status");
      if (!freshBody || freshBody.dataset.task !== taskId || !freshStatus) throw new Error("not this task's page");
      Live.swap(body, freshBody);
      const status = document.getElementById("task-status");
      status.className = freshStatus.className;
      status.textContent = freshStatus.textContent;
      return FINISHED.has(body.dataset.status);
    },
  });
})();
