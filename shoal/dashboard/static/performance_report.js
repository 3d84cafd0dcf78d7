// Renders a shoal performance report from the JSON in #report-data: no network,
// no library; SVG built by hand.
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("report-data").textContent);

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var name in attrs || {}) node.setAttribute(name, attrs[name]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVGNS, tag);
    for (var name in attrs || {}) node.setAttribute(name, attrs[name]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function colour(name) {  // a stable colour per prefix
    var h = 0;
    for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return "hsl(" + (h % 360) + ", 62%, 52%)";
  }
  function seconds(s) {
    if (s >= 100) return s.toFixed(0) + " s";
    if (s >= 1) return s.toFixed(2) + " s";
    if (s >= 0.001) return (s * 1000).toFixed(1) + " ms";
    return (s * 1e6).toFixed(0) + " µs";
  }
  function bytes(n) {
    var units = ["B", "kB", "MB", "GB", "TB"], i = 0;
    while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
  }
  function table(parent, headers, rows, numeric) {
    var t = el("table"), head = el("tr");
    headers.forEach(function (h, i) { head.appendChild(el("th", numeric[i] ? { "class": "num" } : {}, h)); });
    t.appendChild(head);
    rows.forEach(function (row) { t.appendChild(row); });
    parent.appendChild(t);
    return t;
  }
  function empty(parent, text) { parent.appendChild(el("p", { "class": "empty" }, text)); }

  function renderSummary() {
    var box = document.getElementById("summary"), s = data.summary, rows = [];
    [["Scheduler", s.scheduler], ["Workers", s.workers], ["Threads", s.threads],
     ["Memory limit", bytes(s.memory_limit)], ["Duration", seconds(s.duration)],
     ["Tasks run", s.tasks_run], ["Tasks erred", s.tasks_erred],
     ["Compute time", seconds(s.compute_time)], ["Started", s.started], ["shoal", s.version]
    ].forEach(function (pair) {
      var tr = el("tr");
      tr.appendChild(el("th", {}, pair[0]));
      tr.appendChild(el("td", { "data-field": pair[0].toLowerCase().replace(/ /g, "_") }, String(pair[1])));
      rows.push(tr);
    });
    table(box, ["", ""], rows, [false, false]);
  }

  function renderPrefixes() {
    var box = document.getElementById("prefixes"), rows = [];
    if (!data.prefixes.length) return empty(box, "No task finished in this block.");
    data.prefixes.forEach(function (p) {
      var tr = el("tr", { "data-prefix": p.name }), name = el("td", { "class": "name" });
      name.appendChild(el("span", { "class": "swatch", style: "background:" + colour(p.name) }));
      name.appendChild(document.createTextNode(p.name));
      tr.appendChild(name);
      tr.appendChild(el("td", { "class": "num count" }, String(p.count)));
      tr.appendChild(el("td", { "class": "num erred" }, String(p.erred)));
      tr.appendChild(el("td", { "class": "num total" }, seconds(p.total)));
      tr.appendChild(el("td", { "class": "num mean" }, seconds(p.mean)));
      tr.appendChild(el("td", { "class": "num nbytes" }, bytes(p.nbytes)));
      rows.push(tr);
    });
    table(box, ["Prefix", "Tasks", "Erred", "Total time", "Mean time", "Output"], rows,
          [false, true, true, true, true, true]);
  }

  function renderTaskStream() {
    var box = document.getElementById("task-stream"), records = data.records;
    if (!records.length) return empty(box, "No task finished in this block.");
    var t0 = data.summary.start, t1 = data.summary.stop;
    records.forEach(function (r) { t0 = Math.min(t0, r[2]); t1 = Math.max(t1, r[3]); });
    // One lane per worker thread, found again from the bars: each bar goes into the
    // first lane of its worker free at its start.
    var lanes = [], byWorker = {}, placed = [];
    records.slice().sort(function (a, b) { return a[2] - b[2]; }).forEach(function (r) {
      var mine = byWorker[r[1]];
      if (!mine) { mine = byWorker[r[1]] = []; }
      var lane = null;
      for (var i = 0; i < mine.length; i++) if (mine[i].end <= r[2] + 1e-9) { lane = mine[i]; break; }
      if (!lane) { lane = { worker: r[1], end: 0, index: 0 }; mine.push(lane); lanes.push(lane); }
      lane.end = r[3];
      placed.push([lane, r]);
    });
    lanes.sort(function (a, b) { return a.worker < b.worker ? -1 : a.worker > b.worker ? 1 : 0; });
    lanes.forEach(function (lane, i) { lane.index = i; });
    var left = 170, width = Math.max(600, box.clientWidth - 40), plot = width - left - 10;
    var laneHeight = 18, height = lanes.length * laneHeight + 30, span = Math.max(t1 - t0, 1e-6);
    var chart = svg("svg", { width: width, height: height, role: "img", "aria-label": "task stream" });
    lanes.forEach(function (lane, i) {
      chart.appendChild(svg("rect", { "class": "lane", x: left, y: i * laneHeight, width: plot, height: laneHeight - 2 }));
      if (i === 0 || lanes[i - 1].worker !== lane.worker) {
        chart.appendChild(svg("text", { x: 4, y: i * laneHeight + 12 }, lane.worker.replace(/^[a-z]+:\/\//, "")));
      }
    });
    placed.forEach(function (pair) {
      var lane = pair[0], r = pair[1];
      var x = left + (r[2] - t0) / span * plot, w = Math.max(1, (r[3] - r[2]) / span * plot);
      var bar = svg("rect", { "class": "task", "data-prefix": r[4], x: x.toFixed(2), y: lane.index * laneHeight + 1,
                              width: w.toFixed(2), height: laneHeight - 4,
                              fill: r[5] === "erred" ? "#000" : colour(r[4]) });
      bar.appendChild(svg("title", {}, String(r[0]) + " on " + r[1] + ": " + seconds(r[3] - r[2])));
      chart.appendChild(bar);
    });
    var axisY = lanes.length * laneHeight + 4;
    chart.appendChild(svg("line", { "class": "axis", x1: left, x2: left + plot, y1: axisY, y2: axisY }));
    for (var k = 0; k <= 5; k++) {
      var anchor = k === 0 ? "start" : k === 5 ? "end" : "middle";
      chart.appendChild(svg("text", { x: left + k / 5 * plot, y: axisY + 16, "text-anchor": anchor }, seconds(k / 5 * span)));
    }
    box.appendChild(chart);
  }

  function renderTransfers() {
    var box = document.getElementById("transfers"), rows = [];
    data.transfers.forEach(function (t) {
      var tr = el("tr", { "data-worker": t.worker });
      tr.appendChild(el("td", {}, t.worker));
      tr.appendChild(el("td", { "class": "num in" }, bytes(t.bytes_in)));
      tr.appendChild(el("td", { "class": "num out" }, bytes(t.bytes_out)));
      rows.push(tr);
    });
    if (!rows.length) return empty(box, "No worker.");
    table(box, ["Worker", "Fetched from peers", "Sent to peers and clients"], rows, [false, true, true]);
  }

  function renderMemory() {
    var box = document.getElementById("memory"), samples = data.memory;
    if (samples.length < 1) return empty(box, "No memory sample.");
    var workers = {}, t0 = samples[0].time, t1 = samples[samples.length - 1].time, top = 1;
    samples.forEach(function (s) {
      for (var w in s.workers) { workers[w] = true; top = Math.max(top, s.workers[w]); }
    });
    var names = Object.keys(workers).sort(), width = Math.max(600, box.clientWidth - 40);
    var left = 70, plot = width - left - 10, height = 180, span = Math.max(t1 - t0, 1e-6);
    var chart = svg("svg", { width: width, height: height + 24, role: "img", "aria-label": "worker memory" });
    chart.appendChild(svg("line", { "class": "axis", x1: left, x2: left + plot, y1: height, y2: height }));
    chart.appendChild(svg("text", { x: 2, y: 12 }, bytes(top)));
    chart.appendChild(svg("text", { x: 2, y: height }, "0"));
    chart.appendChild(svg("text", { x: left + plot, y: height + 16, "text-anchor": "end" }, seconds(span)));
    var legend = el("div", { "class": "legend" });
    names.forEach(function (w) {
      var points = samples.filter(function (s) { return w in s.workers; }).map(function (s) {
        return (left + (s.time - t0) / span * plot).toFixed(1) + "," + (height - s.workers[w] / top * (height - 16)).toFixed(1);
      });
      if (points.length === 1) points.push(points[0].replace(/^[^,]+/, String(left + plot)));
      chart.appendChild(svg("polyline", { points: points.join(" "), fill: "none", stroke: colour(w), "stroke-width": 2, "data-worker": w }));
      var item = el("span");
      item.appendChild(el("span", { "class": "swatch", style: "background:" + colour(w) }));
      item.appendChild(document.createTextNode(w));
      legend.appendChild(item);
    });
    box.appendChild(chart);
    box.appendChild(legend);
  }

  renderSummary();
  renderPrefixes();
  renderTaskStream();
  renderTransfers();
  renderMemory();
  document.body.setAttribute("data-rendered", "true");
})();
