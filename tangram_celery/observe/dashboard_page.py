"""The page of ``tangram dashboard``: one self-contained HTML document (inline CSS and script,
nothing fetched from elsewhere) that polls ``api/dashboard`` and draws SVG bars. Every string
from Redis reaches the page as text (``textContent``), never as markup."""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tangram dashboard</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f4f5f7;
color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:baseline}
header h1{font-size:18px;margin:0}header span{opacity:.85}
main{display:grid;grid-template-columns:1fr 1fr;gap:14px;padding:14px 20px}
section{background:#fff;border-radius:6px;padding:10px 14px;box-shadow:0 1px 2px #0002}
section.wide{grid-column:1 / span 2}
h2{font-size:14px;margin:0 0 8px;text-transform:uppercase;letter-spacing:.04em;color:#4a5468}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:3px 6px;
border-bottom:1px solid #eceef2;white-space:nowrap}th{color:#6b7488;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:10px;
height:10px;margin-right:4px;border-radius:2px}
.empty{color:#8a93a6;font-style:italic}.bad{color:#c0392b;font-weight:600}
</style></head><body>
<header><h1>tangram</h1><span id="actions-label">actions in the last
<b id="window">-</b> min: <b id="actions">-</b></span><span id="updated">loading</span>
<span id="redis"></span></header>
<main>
<section class="wide"><h2>ACT per kind and pool (mean seconds)</h2>
<div class="legend"><span><i style="background:#4c78a8"></i>queue</span><span>
<i style="background:#54a24b"></i>exec</span><span><i style="background:#f58518"></i>overhead
</span></div><table id="act"></table></section>
<section class="wide"><h2>ACT over the window (mean seconds per bucket)</h2>
<svg id="timeline" width="100%" height="150"></svg></section>
<section><h2>Units in use per pool</h2><table id="pools"></table></section>
<section><h2>Queue depths</h2><table id="queues"></table></section>
<section><h2>Resident reward models</h2><table id="residents"></table></section>
<section class="wide"><h2>Sandbox isolation per CPU node</h2><table id="isolation"></table>
</section>
<section><h2>Slowest recent actions</h2><table id="slowest"></table></section>
</main>
<script>
"use strict";
const COLORS = {queue_s: "#4c78a8", exec_s: "#54a24b", overhead_s: "#f58518"};
const SVG = "http://www.w3.org/2000/svg";
const API = location.origin + location.pathname.replace(/[^/]*$/, "") + "api/dashboard";
function el(tag, attrs, ...kids) {
  const node = tag === "svg" || tag === "rect" ? document.createElementNS(SVG, tag)
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const kid of kids) node.append(kid instanceof Node ? kid : String(kid));
  return node;
}
function fmt(s) { return s >= 10 ? s.toFixed(1) : s >= 0.1 ? s.toFixed(2) : s.toFixed(3); }
function fill(id, head, rows, empty) {
  const table = document.getElementById(id);
  table.replaceChildren(el("tr", {}, ...head.map(h => el("th", {}, h))));
  if (!rows.length) table.append(el("tr", {}, el("td", {class: "empty", colspan: head.length},
    empty)));
  for (const row of rows) table.append(row);
}
function bar(parts, scale, width) {
  const svg = el("svg", {width: width, height: 14});
  let x = 0;
  for (const part of ["queue_s", "exec_s", "overhead_s"]) {
    const w = Math.max(parts[part] / scale * width, 0);
    svg.append(el("rect", {x: x, y: 1, width: w, height: 12, fill: COLORS[part]}));
    x += w;
  }
  return svg;
}
function usage(used, size) {
  const svg = el("svg", {width: 160, height: 14});
  svg.append(el("rect", {x: 0, y: 1, width: 160, height: 12, fill: "#e3e6ec"}));
  if (size) svg.append(el("rect", {x: 0, y: 1, width: Math.min(used / size, 1) * 160,
    height: 12, fill: used >= size ? "#e45756" : "#4c78a8"}));
  return svg;
}
function drawAct(rows) {
  const scale = Math.max(...rows.map(r => r.total_s), 1e-9);
  fill("act", ["kind", "pool", "actions", "errors", "queue", "exec", "overhead", "ACT", ""],
    rows.map(r => el("tr", {class: "act-row", "data-kind": r.kind, "data-pool": r.pool,
      "data-count": r.count, "data-exec": r.exec_s}, el("td", {}, r.kind), el("td", {}, r.pool),
      el("td", {class: "n"}, r.count), el("td", {class: r.errors ? "n bad" : "n"}, r.errors),
      el("td", {class: "n"}, fmt(r.queue_s)), el("td", {class: "n"}, fmt(r.exec_s)),
      el("td", {class: "n"}, fmt(r.overhead_s)), el("td", {class: "n"}, fmt(r.total_s)),
      el("td", {}, bar(r, scale, 320)))), "no action finished in the window");
}
function drawTimeline(buckets) {
  const svg = document.getElementById("timeline");
  const width = svg.clientWidth || 1000, height = 150, gap = 3;
  const scale = Math.max(...buckets.map(b => b.total_s), 1e-9);
  const w = width / buckets.length - gap;
  svg.replaceChildren();
  buckets.forEach((b, i) => {
    let y = height - 14;
    for (const part of ["queue_s", "exec_s", "overhead_s"]) {
      const h = b[part] / scale * (height - 20);
      y -= h;
      svg.append(el("rect", {x: i * (w + gap), y: y, width: w, height: h, fill: COLORS[part]}));
    }
  });
  const total = buckets.reduce((n, b) => n + b.count, 0);
  const span = Math.round(buckets.length * (buckets.length > 1
    ? buckets[1].start - buckets[0].start : 0));
  text(svg, 0, height - 2, "start", "-" + span + " s   (tallest " + fmt(scale) + " s; "
    + total + " actions)");
  text(svg, width, height - 2, "end", "now");
}
function text(svg, x, y, anchor, content) {
  const node = document.createElementNS(SVG, "text");
  for (const [k, v] of Object.entries({x: x, y: y, "text-anchor": anchor, "font-size": 11,
    fill: "#6b7488"})) node.setAttribute(k, v);
  node.textContent = content;
  svg.append(node);
}
function draw(v) {
  document.getElementById("window").textContent = Math.round(v.window_s / 60);
  document.getElementById("actions").textContent = v.actions;
  document.getElementById("updated").textContent = "updated "
    + new Date(v.at * 1000).toLocaleTimeString();
  const redis = document.getElementById("redis");
  redis.textContent = v.redis_up ? "" : "Redis does not answer";
  redis.className = v.redis_up ? "" : "bad";
  drawAct(v.act);
  drawTimeline(v.timeline);
  fill("pools", ["pool", "in use", "size", "", "members"], v.pools.map(p => el("tr",
    {class: "pool-row", "data-pool": p.pool}, el("td", {}, p.pool),
    el("td", {class: "n"}, p.in_use), el("td", {class: "n"}, p.units === null ? "-" : p.units),
    el("td", {}, usage(p.in_use, p.units)), el("td", {class: "n"},
      p.members_alive + "/" + p.members))), "no pool member is registered");
  fill("queues", ["queue", "pool", "ready", "unacked"], v.queues.map(q => el("tr",
    {class: "queue-row", "data-queue": q.queue}, el("td", {}, q.queue), el("td", {}, q.pool),
    el("td", {class: "n"}, q.ready), el("td", {class: "n"}, q.unacked))), "no queue");
  fill("residents", ["pool", "model", "GPUs"], v.residents.map(r => el("tr",
    {class: "resident-row"}, el("td", {}, r.pool), el("td", {}, r.model),
    el("td", {}, r.gpus.join(", ")))), v.gpu_pools ? "no model resident"
    : "no GPU pool publishes its inventory");
  fill("isolation", ["node", "isolation"], v.isolation.map(n => el("tr",
    {class: "isolation-row", "data-node": n.node}, el("td", {}, n.node),
    el("td", {class: n.enforced ? "" : "bad"}, n.isolation))), "no CPU node is registered");
  fill("slowest", ["action", "kind", "node", "status", "queue", "exec", "ACT"],
    v.slowest.map(s => el("tr", {class: "slow-row", "data-action": s.action_id},
      el("td", {}, s.action_id.slice(0, 12)), el("td", {}, s.kind), el("td", {}, s.node),
      el("td", {class: s.status === "ok" ? "" : "bad"}, s.status),
      el("td", {class: "n"}, fmt(s.queue_s)), el("td", {class: "n"}, fmt(s.exec_s)),
      el("td", {class: "n"}, fmt(s.total_s)))), "no action finished in the window");
  document.body.setAttribute("data-drawn", v.at);
}
async function poll() {
  try {
    const response = await fetch(API, {cache: "no-store"});
    if (response.ok) draw(await response.json());
    else document.getElementById("updated").textContent = "error " + response.status;
  } catch (e) {
    document.getElementById("updated").textContent = "unreachable: " + e;
  }
  setTimeout(poll, REFRESH_MS);
}
const REFRESH_MS = 2000;
poll();
</script></body></html>
"""
"""The dashboard document."""
