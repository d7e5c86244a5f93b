// The vendor page's exposure map: data classes on the left, vendors on the right, each band as wide
// as the steps (and judge calls) that carried that class of data to that vendor. A band opens the
// tasks behind it (the page's own ?vendor=&classification= list).
(function () {
  "use strict";
  const target = document.getElementById("exposure-sankey");
  const source = document.getElementById("exposure-data");
  if (!target || !source) return;
  const flows = JSON.parse(source.textContent);
  if (!flows.links.length) {
    Charts.empty(target, "No data reached any vendor in this period.");
    Charts.ready();
    return;
  }
  const colors = Charts.palette(flows.nodes.slice(0, flows.classes));
  const nodeColor = flows.nodes.map((name, i) => (i < flows.classes ? colors(name) : "#8a93a3"));
  const url = (link) => {
    const query = new URLSearchParams(location.search);
    query.set("vendor", link.vendor);
    query.set("classification", link.classification);
    return "?" + query.toString() + "#vendor-tasks";
  };
  Charts.plot(target, [{
    type: "sankey",
    arrangement: "fixed",
    node: { label: flows.nodes.map(Charts.text), color: nodeColor, pad: 18, thickness: 16 },
    link: {
      source: flows.links.map((l) => l.source),
      target: flows.links.map((l) => l.target),
      value: flows.links.map((l) => l.value),
      color: flows.links.map((l) => colors(l.classification) + "66"),
      customdata: flows.links.map((l) => Charts.text(l.classification + " → " + l.vendor + ": " + l.value
        + " call" + (l.value === 1 ? "" : "s") + " from " + l.tasks + " task" + (l.tasks === 1 ? "" : "s"))),
      hovertemplate: "%{customdata}<extra></extra>",
    },
  }], { height: Math.max(260, 60 * Math.max(flows.classes, flows.nodes.length - flows.classes)), margin: { l: 10, r: 10, t: 10, b: 10 } })
    .then(() => {
      target.on("plotly_click", (event) => {
        const point = event && event.points && event.points[0];
        if (!point || point.source === undefined || point.target === undefined) return; // a node, not a band
        const link = flows.links[point.index !== undefined ? point.index : point.pointNumber];
        if (link) location.assign(url(link));
      });
    });
  Charts.ready();
  // The same bands as a list of links, for keyboards, screen readers and tests.
  const list = document.getElementById("exposure-links");
  if (list) {
    flows.links.forEach((link) => {
      const item = document.createElement("li");
      const a = document.createElement("a");
      a.href = url(link);
      a.textContent = link.classification + " → " + link.vendor + " (" + link.value + ")";
      item.appendChild(a);
      list.appendChild(item);
    });
  }
})();
