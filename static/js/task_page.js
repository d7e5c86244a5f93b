// A link to one step of a task (#step-<id>, as the dossier's exposure map makes them) opens that
// step's messages and scrolls to them.
(function () {
  "use strict";
  function open() {
    const match = /^#step-(\d+)$/.exec(location.hash);
    if (!match) return;
    const details = document.querySelector('details[data-key="step-' + match[1] + '"]');
    if (!details) return;
    details.open = true;
    document.getElementById("step-" + match[1]).scrollIntoView({ block: "start" });
  }
  window.addEventListener("hashchange", open);
  open();
})();
