// Live overview: re-read the overview from the server every few seconds; the server renders (and
// escapes) it.
(function () {
  "use strict";
  const body = document.getElementById("ops-body");
  if (!body) return;
  setInterval(async () => {
    const response = await fetch(body.dataset.partial, { credentials: "same-origin" });
    if (response.ok) body.innerHTML = await response.text();
  }, 5000);
})();
