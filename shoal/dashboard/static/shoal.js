// shoal dashboard: live pages fed by server-sent events (api/v1/stream) and the JSON
// API (api/v1/...). Hand-written, no library. URLs are relative, so the dashboard
// works behind a proxy that serves it under a path prefix (JupyterHub).
"use strict";

// ------------------------------------------------------------------ helpers

const $ = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k === "style") Object.assign(node.style, v);
    else node[k] = v;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB", "PB"];
  let i = 0;
  let x = Number(n);
  while (Math.abs(x) >= 1000 && i < units.length - 1) { x /= 1000; i++; }
  return (i === 0 ? x.toFixed(0) : x.toFixed(x < 10 ? 2 : 1)) + " " + units[i];
}

function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1e3).toFixed(1) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

const fmtInt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));

function colorOf(name) {  // a stable colour per task prefix
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
  return `hsl(${h % 360}, 62%, 52%)`;
}

async function api(path) {
  const response = await fetch("api/v1/" + path, { credentials: "same-origin" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function setLive(on, text) {
  const live = $("live");
  live.className = "live " + (on ? "on" : "off");
  live.textContent = text || (on ? "live" : "disconnected");
}

// A push stream: each topic's handler gets its snapshot (full) then deltas. On a
// break the browser reconnects and the snapshots come again.
function subscribe(topics, handlers) {
  let source = null;
  const open = () => {
    source = new EventSource("api/v1/stream?topics=" + topics.join(","));
    source.onopen = () => setLive(true);
    source.onerror = () => setLive(false, "reconnecting");
    for (const topic of topics) {
      source.addEventListener(topic, (event) => {
        try {
          handlers[topic](JSON.parse(event.data));
        } catch (err) {
          if (err instanceof OutOfSync) { source.close(); open(); } else throw err;
        }
      });
    }
  };
  open();
}

class OutOfSync extends Error {}

function every(seconds, fn) {  // run now, then again after each run (no overlap)
  const run = async () => {
    try { await fn(); setLive(true, "updated " + new Date().toLocaleTimeString()); }
    catch (err) { setLive(false, err.message); }
    setTimeout(run, seconds * 1000);
  };
  run();
}

// A canvas sized to its box (sharp on high-DPI screens); returns its 2D context.
function fitCanvas(canvas, height) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 600;
  if (height) canvas.style.height = height + "px";
  const h = height || canvas.clientHeight || Number(canvas.getAttribute("height"));
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(h * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, h);
  ctx.font = "11px system-ui, sans-serif";
  return { ctx, width, height: h };
}

// Lines over time: series [{points: [[x, y], ...], color, dash}], x in seconds.
function lineChart(canvas, series, opts) {
  const { ctx, width, height } = fitCanvas(canvas);
  const left = 56, bottom = 18, top = 6;
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1]));
  if (!xs.length) {
    ctx.fillStyle = "#66717d";
    ctx.fillText("no samples yet", left, height / 2);
    return;
  }
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const y1 = Math.max(...ys, opts.ymin || 0, 1e-9) * 1.1;
  const X = (x) => left + ((x - x0) / (x1 - x0)) * (width - left - 8);
  const Y = (y) => top + (1 - y / y1) * (height - top - bottom);
  ctx.strokeStyle = "#d9dee4";
  ctx.fillStyle = "#66717d";
  for (const f of [0, 0.5, 1]) {
    ctx.beginPath(); ctx.moveTo(left, Y(y1 * f)); ctx.lineTo(width - 8, Y(y1 * f)); ctx.stroke();
    ctx.fillText(opts.fmt(y1 * f), 2, Y(y1 * f) + 4);
  }
  ctx.fillText(opts.xlabel || "", left, height - 4);
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.setLineDash(s.dash ? [4, 3] : []);
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    s.points.forEach(([x, y], i) => (i ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y))));
    ctx.stroke();
  }
  ctx.setLineDash([]);
}

const STATE_ORDER = ["released", "waiting", "queued", "processing", "memory", "erred"];

// Progress of one prefix or group: a bar of done / erred / processing / waiting.
function progressBar(states) {
  const n = (k) => states[k] || 0;
  const total = STATE_ORDER.reduce((a, k) => a + n(k), 0) || 1;
  const part = (cls, count) => el("div", { class: cls, style: { width: (100 * count) / total + "%" } });
  return el(
    "div", { class: "bar" },
    part("memory", n("memory")), part("erred", n("erred")), part("processing", n("processing")),
  );
}

function progressCounts(states) {
  const n = (k) => states[k] || 0;
  const waiting = n("released") + n("waiting") + n("queued");
  return `${fmtInt(n("memory"))} done · ${fmtInt(n("erred"))} erred · ` +
    `${fmtInt(n("processing"))} running · ${fmtInt(waiting)} waiting`;
}

// The cluster summary as pushed: a snapshot, then deltas on the version held.
function summaryTracker(onChange) {
  let state = null;
  return (delta) => {
    if (delta.base === -1) {
      state = { ...delta, prefixes: new Map(delta.prefixes.map((p) => [p.name, p])) };
    } else {
      if (!state || state.version !== delta.base) throw new OutOfSync();
      const prefixes = state.prefixes;
      for (const name of delta.removed) prefixes.delete(name);
      for (const p of delta.prefixes) prefixes.set(p.name, p);
      state = { ...delta, prefixes };
    }
    onChange(state);
  };
}

// Workers' telemetry as pushed: rows (arrays in the order of `fields`) by address.
function workersTracker(onChange) {
  let fields = null;
  const rows = new Map();
  return (delta) => {
    if (delta.full) { fields = delta.fields; rows.clear(); }
    if (!fields) throw new OutOfSync();
    for (const address of delta.removed) rows.delete(address);
    for (const row of delta.changed) {
      const obj = {};
      fields.forEach((f, i) => (obj[f] = row[i]));
      rows.set(obj.address, obj);
    }
    onChange(rows);
  };
}

function throttle(fn, ms) {  // redraw at most once per `ms`, always after the last call
  let timer = null;
  return () => {
    if (timer === null) timer = setTimeout(() => { timer = null; fn(); }, ms);
  };
}

// ------------------------------------------------------------------ status

function statusPage() {
  const renderSummary = (s) => {
    const states = $("states");
    states.replaceChildren(...STATE_ORDER.map((name) =>
      el("div", { class: "state", id: "state-" + name },
        el("div", { class: "n" }, fmtInt(s.tasks[name] || 0)), el("div", { class: "label" }, name))));
    const total = Object.values(s.tasks).reduce((a, b) => a + b, 0);
    $("tasks-total").textContent = `${fmtInt(total)} tasks · ${s.workers} workers · ` +
      `${s.nthreads} threads · ${fmtBytes(s.nbytes)} held`;
    const prefixes = [...s.prefixes.values()].reverse().slice(0, 40);  // newest first
    $("progress").replaceChildren(...prefixes.map((p) =>
      el("div", { class: "progress-row", dataset: { prefix: p.name } },
        el("div", { class: "name", title: p.name }, p.name), progressBar(p.states),
        el("div", { class: "counts" }, progressCounts(p.states)))));
  };

  // Task stream: the last minute of bars; rows per worker from the server's lanes.
  const WINDOW = 60;
  let records = [];
  let received = 0;
  const drawStream = throttle(() => {
    const canvas = $("task-stream");
    const newest = Math.max(Date.now() / 1000, ...records.map((r) => r.stop));
    records = records.filter((r) => r.stop >= newest - WINDOW);
    const lanes = new Map();  // worker -> rows it needs
    for (const r of records) lanes.set(r.worker, Math.max(lanes.get(r.worker) || 0, r.lane + 1));
    const workers = [...lanes.keys()].sort();
    const base = new Map();
    let rows = 0;
    for (const w of workers) { base.set(w, rows); rows += lanes.get(w); }
    const rowHeight = Math.max(2, Math.min(14, 400 / Math.max(rows, 1)));
    const height = Math.max(120, rows * rowHeight + 24);
    const { ctx, width } = fitCanvas(canvas, height);
    const left = 4, right = width - 4;
    const X = (t) => left + ((t - (newest - WINDOW)) / WINDOW) * (right - left);
    for (const r of records) {
      ctx.fillStyle = r.status === "erred" ? "#000" : colorOf(r.prefix);
      const x = X(r.start);
      ctx.fillRect(x, (base.get(r.worker) + r.lane) * rowHeight, Math.max(1, X(r.stop) - x),
        rowHeight - (rowHeight > 4 ? 1 : 0));
    }
    ctx.fillStyle = "#66717d";
    ctx.fillText("-60 s", left, height - 6);
    ctx.fillText("now", right - 22, height - 6);
    canvas.dataset.bars = String(records.length);
    canvas.dataset.received = String(received);
    $("stream-count").textContent =
      `${fmtInt(records.length)} tasks in the last minute on ${workers.length} workers`;
  }, 250);

  const renderWorkers = throttle(() => {
    const workers = [...workerRows.values()];
    drawMemory($("memory"), workers);
    const tbody = $("cpu-table").tBodies[0];
    tbody.replaceChildren(...workers.slice(0, 200).map((w) =>
      el("tr", {},
        el("td", {}, el("a", { href: "worker?address=" + encodeURIComponent(w.address) }, w.name)),
        el("td", { class: "num" }, w.nthreads), el("td", { class: "num" }, w.processing),
        el("td", {}, el("div", { class: "bar" },
          el("div", { class: "processing", style: { width: Math.min(100, w.cpu / w.nthreads) + "%" } }))),
        el("td", { class: "num" }, w.cpu.toFixed(0)),
        el("td", { class: "num" }, fmtBytes(w.net_in) + "/s"),
        el("td", { class: "num" }, fmtBytes(w.net_out) + "/s"))));
  }, 250);
  let workerRows = new Map();

  subscribe(["summary", "task-stream", "workers"], {
    summary: summaryTracker(renderSummary),
    "task-stream": (delta) => {
      if (delta.full) records = [];
      records.push(...delta.records);
      received += delta.records.length;
      drawStream();
    },
    workers: workersTracker((rows) => { workerRows = rows; renderWorkers(); }),
  });
  setInterval(drawStream, 1000);  // the window slides even when nothing finishes
}

// Per-worker memory: managed (results held), unmanaged (the rest of the process),
// spilled (on disk), against the limit, with the pause and terminate lines.
function drawMemory(canvas, workers) {
  const n = workers.length;
  const rowHeight = Math.max(2, Math.min(16, 300 / Math.max(n, 1)));
  const { ctx, width, height } = fitCanvas(canvas, Math.max(60, n * rowHeight + 20));
  const css = getComputedStyle(document.documentElement);
  const color = (name) => css.getPropertyValue("--" + name).trim();
  const scale = Math.max(1, ...workers.map((w) => Math.max(w.memory_limit, w.memory + w.spilled)));
  const left = 4, span = width - 8;
  const X = (bytes) => left + (bytes / scale) * span;
  workers.forEach((w, i) => {
    const y = i * rowHeight, h = rowHeight - (rowHeight > 4 ? 2 : 0);
    const managed = Math.min(w.nbytes, w.memory);
    const unmanaged = Math.max(0, w.memory - managed);
    ctx.fillStyle = color("managed"); ctx.fillRect(X(0), y, X(managed) - left, h);
    ctx.fillStyle = color("unmanaged"); ctx.fillRect(X(managed), y, X(unmanaged) - left, h);
    ctx.fillStyle = color("spilled"); ctx.fillRect(X(w.memory), y, X(w.spilled) - left, h);
    const mark = (fraction, name, dash) => {
      if (fraction === null || fraction === undefined || !w.memory_limit) return;
      ctx.strokeStyle = color(name);
      ctx.setLineDash(dash ? [3, 2] : []);
      const x = X(fraction * w.memory_limit);
      ctx.beginPath(); ctx.moveTo(x, y); ctx.lineTo(x, y + h); ctx.stroke();
    };
    mark(w.memory_pause, "pause", false);
    mark(w.memory_terminate, "terminate", false);
    mark(1, "fg", true);  // the limit
  });
  ctx.setLineDash([]);
  ctx.fillStyle = color("muted");
  ctx.fillText(`0 – ${fmtBytes(scale)} per worker`, left, height - 4);
}

// ------------------------------------------------------------------ workers

function workersPage() {
  const PAGE = 100;
  let start = 0, rows = [], total = 0, sortKey = "address", ascending = true;
  const live = new Map();

  const value = (w, key) => (key === "pins" ? w.pins.length : w[key]);
  const render = () => {
    const merged = rows.map((w) => ({ ...w, ...(live.get(w.address) || {}) }));
    merged.sort((a, b) => {
      const x = value(a, sortKey), y = value(b, sortKey);
      const order = x === y ? 0 : x === null ? 1 : y === null ? -1 : x < y ? -1 : 1;
      return ascending ? order : -order;
    });
    $("workers-table").tBodies[0].replaceChildren(...merged.map((w) => el("tr", {},
      el("td", {}, el("a", { href: "worker?address=" + encodeURIComponent(w.address) }, w.address)),
      el("td", {}, w.name), el("td", { class: "num" }, w.nthreads),
      el("td", { class: "num" }, fmtBytes(w.memory)), el("td", { class: "num" }, fmtBytes(w.memory_limit)),
      el("td", { class: "num" }, w.processing), el("td", { class: "num" }, fmtBytes(w.nbytes)),
      el("td", { class: "num" }, Number(w.cpu).toFixed(0)),
      el("td", {}, w.pins.map((p) => `${p.reason} (${p.owner})`).join(", ") || "–"),
      el("td", { class: "num" }, fmtSeconds(w.lifetime_left)),
      el("td", { class: "num" }, w.tasks_left === null ? "–" : fmtInt(w.tasks_left)),
      el("td", {}, w.status))));
    for (const th of document.querySelectorAll("th.sortable")) {
      th.classList.toggle("sorted-asc", th.dataset.key === sortKey && ascending);
      th.classList.toggle("sorted-desc", th.dataset.key === sortKey && !ascending);
    }
    $("workers-total").textContent = `${fmtInt(total)} workers`;
    $("page-info").textContent = total ? `${start + 1}–${Math.min(total, start + PAGE)} of ${total}` : "";
    $("prev").disabled = start === 0;
    $("next").disabled = start + PAGE >= total;
  };
  const load = async () => {
    const page = await api(`workers?start=${start}&limit=${PAGE}`);
    rows = page.workers; total = page.total;
    render();
  };
  for (const th of document.querySelectorAll("th.sortable")) {
    th.addEventListener("click", () => {
      ascending = th.dataset.key === sortKey ? !ascending : true;
      sortKey = th.dataset.key;
      render();
    });
  }
  $("prev").addEventListener("click", () => { start = Math.max(0, start - PAGE); load(); });
  $("next").addEventListener("click", () => { start += PAGE; load(); });
  every(5, load);  // pins, lifetimes: the page of workers, O(page)
  const rerender = throttle(render, 250);
  subscribe(["workers"], {
    workers: workersTracker((pushed) => {
      live.clear();
      for (const [address, w] of pushed) live.set(address, w);
      if (pushed.size !== total) load(); else rerender();
    }),
  });
}

function workerPage() {
  const address = new URLSearchParams(location.search).get("address") || "";
  $("worker-title").textContent = "Worker " + address;
  every(2, async () => {
    const w = await api("workers/" + encodeURIComponent(address));
    const info = [
      ["name", w.name], ["host", w.host], ["pid", w.pid], ["status", w.status],
      ["threads", w.nthreads], ["running", w.processing], ["tasks run", fmtInt(w.tasks_run)],
      ["memory", `${fmtBytes(w.memory)} of ${fmtBytes(w.memory_limit)}`],
      ["results held", fmtBytes(w.nbytes)], ["spilled", fmtBytes(w.spilled)],
      ["CPU", w.cpu.toFixed(0) + " %"],
      ["network", `${fmtBytes(w.net_in)}/s in, ${fmtBytes(w.net_out)}/s out`],
      ["pins", w.pins.map((p) => `${p.reason} (${p.owner})`).join(", ") || "–"],
      ["lifetime left", fmtSeconds(w.lifetime_left)],
      ["budget left", w.tasks_left === null ? "–" : fmtInt(w.tasks_left)],
    ];
    $("worker-info").tBodies[0].replaceChildren(...info.map(([k, v]) =>
      el("tr", {}, el("th", {}, k), el("td", {}, v))));
    const history = w.history;
    const memory = history.map((h) => [-h.ago, h.memory]);
    const limit = history.length ? [[-history[0].ago, w.memory_limit], [-history[history.length - 1].ago, w.memory_limit]] : [];
    lineChart($("memory-history"), [
      { points: memory, color: "#3b7dd8" },
      { points: history.map((h) => [-h.ago, h.spilled]), color: "#a8a8a8" },
      { points: limit, color: "#c62828", dash: true },
    ], { fmt: fmtBytes, xlabel: "seconds ago →  now" });
    lineChart($("cpu-history"), [{ points: history.map((h) => [-h.ago, h.cpu]), color: "#2e9e5b" }],
      { fmt: (v) => v.toFixed(0), ymin: 100, xlabel: "seconds ago →  now" });
  });
}

// ------------------------------------------------------------------ groups

function groupsPage() {
  const PAGE = 50;
  let prefixStart = 0, groupStart = 0, prefixes = [];
  const select = $("groups-prefix");
  const renderPrefixes = () => {
    const page = prefixes.slice(prefixStart, prefixStart + PAGE);
    $("prefixes-total").textContent = `${prefixes.length} prefixes`;
    $("prefixes").replaceChildren(...page.map((p) =>
      el("div", { class: "progress-row" },
        el("div", { class: "name", title: p.name }, p.name), progressBar(p.states),
        el("div", { class: "counts" }, progressCounts(p.states)))));
    $("prefixes-prev").disabled = prefixStart === 0;
    $("prefixes-next").disabled = prefixStart + PAGE >= prefixes.length;
    const chosen = select.value;
    select.replaceChildren(el("option", { value: "" }, "all"),
      ...prefixes.map((p) => el("option", { value: p.name, selected: p.name === chosen }, p.name)));
  };
  const loadGroups = async () => {
    const prefix = encodeURIComponent(select.value);
    const page = await api(`groups?start=${groupStart}&limit=${PAGE}&prefix=${prefix}`);
    $("groups-total").textContent = `${fmtInt(page.total)} groups`;
    $("groups-table").tBodies[0].replaceChildren(...page.groups.map((g) => {
      const count = Object.values(g.states).reduce((a, b) => a + b, 0);
      const mean = g.duration_count ? g.duration_sum / g.duration_count : null;
      return el("tr", {}, el("td", {}, g.name), el("td", {}, progressBar(g.states)),
        el("td", { class: "num" }, fmtInt(count)), el("td", { class: "num" }, fmtBytes(g.nbytes)),
        el("td", { class: "num" }, fmtSeconds(mean)));
    }));
    $("groups-prev").disabled = groupStart === 0;
    $("groups-next").disabled = groupStart + PAGE >= page.total;
  };
  $("prefixes-prev").addEventListener("click", () => { prefixStart = Math.max(0, prefixStart - PAGE); renderPrefixes(); });
  $("prefixes-next").addEventListener("click", () => { prefixStart += PAGE; renderPrefixes(); });
  $("groups-prev").addEventListener("click", () => { groupStart = Math.max(0, groupStart - PAGE); loadGroups(); });
  $("groups-next").addEventListener("click", () => { groupStart += PAGE; loadGroups(); });
  select.addEventListener("change", () => { groupStart = 0; loadGroups(); });
  const redraw = throttle(renderPrefixes, 250);
  subscribe(["summary"], {
    summary: summaryTracker((s) => { prefixes = [...s.prefixes.values()].reverse(); redraw(); }),
  });
  every(2, loadGroups);
}

// ------------------------------------------------------------------ task

function taskPage() {
  const key = new URLSearchParams(location.search).get("key") || "";
  $("task-title").textContent = "Task " + key;
  const keyLink = (k) => el("a", { href: "task?key=" + encodeURIComponent(k) }, k);
  const listInto = (table, counter, deps) => {
    $(counter).textContent = deps.count > deps.tasks.length ? `(${deps.tasks.length} of ${deps.count})` : `(${deps.count})`;
    $(table).tBodies[0].replaceChildren(...deps.tasks.map((d) =>
      el("tr", {}, el("td", {}, keyLink(d.key)), el("td", {}, d.state))));
  };
  every(2, async () => {
    const t = await api("tasks/" + encodeURIComponent(key));
    const worker = (a) => el("a", { href: "worker?address=" + encodeURIComponent(a) }, a);
    const info = [
      ["state", t.state], ["prefix", t.prefix], ["group", t.group], ["type", t.type || "–"],
      ["bytes", fmtBytes(t.nbytes)], ["retries left", t.retries],
      ["processing on", t.processing_on ? worker(t.processing_on) : "–"],
      ["held by", t.who_has.length ? el("span", {}, ...t.who_has.flatMap((a, i) => (i ? [", ", worker(a)] : [worker(a)]))) : "–"],
      ["wanted by", t.who_wants.join(", ") || "–"],
    ];
    $("task-info").tBodies[0].replaceChildren(...info.map(([k, v]) =>
      el("tr", {}, el("th", {}, k), el("td", {}, v))));
    $("task-error-section").hidden = !t.error;
    if (t.error) {
      $("task-error").textContent = t.error + (t.blamed && t.blamed !== t.key ? ` (from ${t.blamed})` : "");
      $("task-traceback").textContent = t.traceback || "";
    }
    listInto("deps", "deps-count", t.dependencies);
    listInto("dependents", "dependents-count", t.dependents);
    $("story").tBodies[0].replaceChildren(...t.story.slice().reverse().map((entry) =>
      el("tr", {}, el("td", {}, entry[0]), el("td", {}, entry[1] ?? ""), el("td", {}, entry[2] ?? ""),
        el("td", { class: "muted" }, entry.slice(3).join(" ")))));
  });
}

// ------------------------------------------------------------------ events

function eventsPage() {
  const select = $("topic");
  select.addEventListener("change", () => load());
  const load = async () => {
    const topic = encodeURIComponent(select.value);
    const answer = await api(`events?limit=200&topic=${topic}`);
    const chosen = select.value;
    select.replaceChildren(el("option", { value: "" }, "all"),
      ...answer.topics.map((t) => el("option", { value: t, selected: t === chosen }, t)));
    const rows = Object.entries(answer.events).flatMap(([topic, events]) => events.map((e) => ({ topic, ...e })));
    rows.sort((a, b) => b.time - a.time);
    $("events-table").tBodies[0].replaceChildren(...rows.slice(0, 500).map((e) =>
      el("tr", {}, el("td", {}, new Date(e.time * 1000).toLocaleTimeString()), el("td", {}, e.topic),
        el("td", {}, Object.entries(e.data).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join("  ")))));
  };
  every(3, load);
}

// ------------------------------------------------------------------ system

function systemPage() {
  let samples = [];
  const redraw = throttle(() => {
    const latest = samples[samples.length - 1];
    if (latest) {
      const info = [
        ["CPU", latest.cpu.toFixed(1) + " %"], ["memory (RSS)", fmtBytes(latest.memory)],
        ["event-loop latency", fmtSeconds(latest.loop_latency)],
        ["messages in / out", `${latest.messages_in.toFixed(0)}/s, ${latest.messages_out.toFixed(0)}/s`],
        ["bytes in / out", `${fmtBytes(latest.bytes_in)}/s, ${fmtBytes(latest.bytes_out)}/s`],
        ["connections", latest.connections],
      ];
      $("system-now").tBodies[0].replaceChildren(...info.map(([k, v]) =>
        el("tr", {}, el("th", {}, k), el("td", { id: "system-" + k.split(" ")[0].toLowerCase() }, v))));
    }
    const t0 = latest ? latest.time : 0;
    const series = (field, color) => ({ points: samples.map((s) => [s.time - t0, s[field]]), color });
    const x = { xlabel: "seconds ago →  now" };
    lineChart($("sys-cpu"), [series("cpu", "#2e9e5b")], { ...x, fmt: (v) => v.toFixed(0), ymin: 100 });
    lineChart($("sys-memory"), [series("memory", "#3b7dd8")], { ...x, fmt: fmtBytes });
    lineChart($("sys-latency"), [series("loop_latency", "#d9822b")], { ...x, fmt: fmtSeconds, ymin: 0.01 });
    lineChart($("sys-messages"), [series("messages_in", "#3b7dd8"), series("messages_out", "#c62828")],
      { ...x, fmt: (v) => v.toFixed(0) });
  }, 250);
  subscribe(["system"], {
    system: (delta) => {
      if (delta.full) samples = [];
      samples.push(...delta.samples);
      samples = samples.slice(-240);
      redraw();
    },
  });
}

const PAGES = {
  status: statusPage, workers: workersPage, worker: workerPage, groups: groupsPage,
  task: taskPage, events: eventsPage, system: systemPage,
};
PAGES[document.body.dataset.page]();
