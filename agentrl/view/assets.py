"""The report page's stylesheet and script, inlined into every report (no external assets, no server).

The script reads `<script type="application/json" id="index">` (one row per trajectory, see `data.INDEX_COLUMNS`),
renders only the table rows in view (virtual scrolling: the row count does not change the DOM size), filters and
sorts in memory, and parses a trajectory's detail (`<script type="application/json" id="d{row}">`) only when its
row is clicked. It uses no network and no `eval`.
"""

CSS = r"""
:root { --model: #dbe8f7; --model-b: #4c78a8; --tool: #fde5cc; --tool-b: #f58518; --bad: #c62828; --ok: #2e7d32; }
* { box-sizing: border-box; }
[hidden] { display: none !important; }
.err { color: var(--bad); }
.overview { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.overview > div { min-width: 0; }
.overview > div.steps { flex: 1 1 660px; }
.overview .plots { max-width: 672px; }
details > summary { cursor: pointer; font-weight: 600; font-size: 15px; margin: 14px 0 4px; }
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 16px 40px; color: #222; }
h1 { font-size: 18px; margin: 14px 0 2px; } h2 { font-size: 15px; margin: 18px 0 6px; }
h3 { font-size: 13px; margin: 8px 0 4px; }
.sub { color: #666; }
table.stats { border-collapse: collapse; margin: 4px 0; }
table.stats td, table.stats th { border-bottom: 1px solid #eee; padding: 2px 10px 2px 4px; text-align: right; }
table.stats th:first-child, table.stats td:first-child { text-align: left; }
.up { color: var(--ok); } .down { color: var(--bad); } .delta { font-size: 11px; margin-left: 3px; }
.plots { display: flex; flex-wrap: wrap; gap: 8px; }
svg.plot { border: 1px solid #eee; background: #fff; }
svg.plot .t { font-size: 12px; font-weight: 600; } svg.plot .l { font-size: 10px; fill: #555; }
svg.plot .ax { stroke: #999; stroke-width: 1; }
.filters { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin: 6px 0; }
.filters input, .filters select { font: inherit; padding: 2px 4px; }
.filters input[type=number] { width: 70px; }
#count { font-weight: 600; margin-left: 8px; }
.grid { display: grid;
  grid-template-columns: 220px minmax(120px, 1fr) 50px 120px 60px 60px 50px 50px 60px 80px 80px 70px 60px 140px; }
#thead { font-weight: 600; background: #f4f4f4; border: 1px solid #ddd; border-bottom: none; }
#thead > div { padding: 3px 4px; cursor: pointer; user-select: none; white-space: nowrap; }
#thead > div.sorted::after { content: " \25BE"; } #thead > div.sorted.asc::after { content: " \25B4"; }
#vp { height: 42vh; overflow-y: auto; border: 1px solid #ddd; position: relative; outline: none; }
#spacer { position: relative; }
#rows { position: absolute; left: 0; right: 0; top: 0; }
.row { height: 24px; border-bottom: 1px solid #f0f0f0; cursor: pointer; }
.row > div { padding: 3px 4px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.row:hover { background: #f6f9ff; } .row.sel { background: #e3edfb; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.st { border-radius: 3px; padding: 0 4px; font-size: 11px; background: #eee; }
.st-ok { background: #e0f2e1; } .st-infra_error, .st-policy_error { background: #fbe0e0; }
.st-timeout, .st-truncated, .st-context_exhausted, .st-max_turns { background: #fff1d6; }
#detail { margin-top: 14px; }
.kv { display: grid; grid-template-columns: repeat(auto-fill, minmax(210px, 1fr)); gap: 2px 14px; }
.kv > div > b { color: #555; font-weight: 600; margin-right: 4px; }
.strip { display: flex; height: 14px; border: 1px solid #ccc; margin: 6px 0 2px; }
.strip > span { display: block; min-width: 1px; }
.m { background: var(--model-b); } .e { background: var(--tool-b); }
.legend span.sw { display: inline-block; width: 10px; height: 10px; margin: 0 3px 0 10px; vertical-align: -1px; }
.turn { border: 1px solid #ddd; border-radius: 4px; margin: 10px 0; }
.turn-h { background: #f6f6f6; padding: 4px 8px; border-bottom: 1px solid #ddd; }
.turn-h .flag { color: var(--bad); font-weight: 600; }
.span { margin: 6px 8px; border-left: 4px solid; padding: 2px 8px; }
.span-model { background: var(--model); border-color: var(--model-b); }
.span-tool { background: var(--tool); border-color: var(--tool-b); }
.lbl { font-size: 11px; color: #444; font-weight: 600; }
pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0;
  font: 12px/1.35 ui-monospace, Menlo, Consolas, monospace; }
.call, .result { margin: 4px 8px 4px 20px; padding: 2px 8px; border: 1px dashed #bbb; border-radius: 3px; }
.result.fail { border-color: var(--bad); } .result .err { color: var(--bad); font-weight: 600; }
.tests .pass { color: var(--ok); } .tests .fail { color: var(--bad); }
.banner { background: #fff4e5; border: 1px solid #f5c27a; padding: 6px 10px; margin: 8px 0; }
"""

JS = r"""
(function () {
  "use strict";
  var IDX = JSON.parse(document.getElementById("index").textContent);
  var ROWS = IDX.rows, C = {};
  IDX.cols.forEach(function (c, i) { C[c] = i; });
  var ROW_H = 24;
  var vp = document.getElementById("vp"), spacer = document.getElementById("spacer");
  var body = document.getElementById("rows"), detailEl = document.getElementById("detail");
  var view = [], sortKey = null, sortDir = 1, selected = -1;

  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function num(v, d) {
    if (v === null || v === undefined) return "\u2013";
    return Number.isInteger(v) ? String(v) : v.toFixed(d === undefined ? 3 : d);
  }
  var DOT = " \u00b7 ";
  function tag(name, cls, inner) { return "<" + name + ' class="' + cls + '">' + inner + "</" + name + ">"; }
  function badge(status) { return tag("span", "st st-" + esc(status), esc(status)); }
  function secs(v) { return num(v, 3) + " s"; }
  function tests(r) { return r[C.total] === null ? "\u2013" : r[C.passed] + "/" + r[C.total]; }
  function wv(r) {
    if (r[C.wv_min] === null) return "\u2013";
    return r[C.wv_min] === r[C.wv_max] ? String(r[C.wv_min]) : r[C.wv_min] + "\u2013" + r[C.wv_max];
  }
  var COLS = [
    ["id", "id", function (r) { return esc(r[C.id]); }, ""],
    ["task", "task", function (r) { return esc(r[C.task]); }, ""],
    ["step", "step", function (r) { return num(r[C.step]); }, "num"],
    ["status", "status", function (r) { return badge(r[C.status]); }, ""],
    ["reward", "reward", function (r) { return num(r[C.reward]); }, "num"],
    ["passed", "tests", tests, "num"],
    ["turns", "turns", function (r) { return num(r[C.turns]); }, "num"],
    ["calls", "calls", function (r) { return num(r[C.calls]); }, "num"],
    ["tool_errors", "tool err", function (r) { return num(r[C.tool_errors]); }, "num"],
    ["model_tokens", "model tok", function (r) { return num(r[C.model_tokens]); }, "num"],
    ["tool_tokens", "tool tok", function (r) { return num(r[C.tool_tokens]); }, "num"],
    ["total_s", "time (s)", function (r) { return num(r[C.total_s], 2); }, "num"],
    ["wv_min", "weights", wv, "num"],
    ["flags", "integrity", function (r) { return r[C.flags] ? '<span class="flag">' + esc(r[C.flags]) + "</span>" : ""; }, ""]
  ];

  function header() {
    var h = document.getElementById("thead");
    h.innerHTML = COLS.map(function (c) {
      var cls = c[3] + (sortKey === c[0] ? " sorted" + (sortDir > 0 ? " asc" : "") : "");
      return '<div class="' + cls + '" data-key="' + c[0] + '">' + c[1] + "</div>";
    }).join("");
  }

  function render() {
    var first = Math.max(0, Math.floor(vp.scrollTop / ROW_H) - 5);
    var last = Math.min(view.length, first + Math.ceil((vp.clientHeight || 600) / ROW_H) + 10);
    var html = [];
    for (var k = first; k < last; k++) {
      var i = view[k], r = ROWS[i];
      html.push('<div class="row grid' + (i === selected ? " sel" : "") + '" data-i="' + i + '">' +
        COLS.map(function (c) { return '<div class="' + c[3] + '">' + c[2](r) + "</div>"; }).join("") + "</div>");
    }
    body.style.transform = "translateY(" + first * ROW_H + "px)";
    body.innerHTML = html.join("");
  }

  function val(id) { return document.getElementById(id).value; }
  function apply() {
    var st = val("f-status"), step = val("f-step"), task = val("f-task").toLowerCase(), q = val("f-id").toLowerCase();
    var rmin = val("f-rmin") === "" ? null : parseFloat(val("f-rmin"));
    var rmax = val("f-rmax") === "" ? null : parseFloat(val("f-rmax"));
    view = [];
    for (var i = 0; i < ROWS.length; i++) {
      var r = ROWS[i], rw = r[C.reward];
      if (st && r[C.status] !== st) continue;
      if (step !== "" && String(r[C.step]) !== step) continue;
      if (task && String(r[C.task]).toLowerCase().indexOf(task) < 0) continue;
      if (q && String(r[C.id]).toLowerCase().indexOf(q) < 0) continue;
      if (rmin !== null && (rw === null || rw < rmin)) continue;
      if (rmax !== null && (rw === null || rw > rmax)) continue;
      view.push(i);
    }
    if (sortKey !== null) {
      var k = C[sortKey];
      view.sort(function (a, b) {
        var x = ROWS[a][k], y = ROWS[b][k];
        if (x === y) return a - b;
        if (x === null) return 1;
        if (y === null) return -1;
        return (x < y ? -1 : 1) * sortDir;
      });
    }
    spacer.style.height = view.length * ROW_H + "px";
    document.getElementById("count").textContent = view.length + " of " + ROWS.length + " trajectories";
    render();
  }

  function options(id, key) {
    var seen = {}, vals = [];
    ROWS.forEach(function (r) { var v = r[C[key]]; if (v !== null && !seen[v]) { seen[v] = 1; vals.push(v); } });
    vals.sort(function (a, b) { return a < b ? -1 : a > b ? 1 : 0; });
    var el = document.getElementById(id);
    vals.forEach(function (v) {
      var o = document.createElement("option");
      o.value = o.textContent = String(v);
      el.appendChild(o);
    });
  }

  function pre(text, cls) { return '<pre class="' + (cls || "") + '">' + esc(text) + "</pre>"; }
  function kv(pairs) {
    return tag("div", "kv", pairs.map(function (p) { return "<div><b>" + esc(p[0]) + "</b>" + p[1] + "</div>"; })
      .join(""));
  }
  function strip(d) {
    var model = 0, tool = 0;
    var spans = d.mask.map(function (run) {
      if (run[0]) model += run[1]; else tool += run[1];
      return '<span class="' + (run[0] ? "m" : "e") + '" style="flex-grow:' + run[1] + '" title="' +
        (run[0] ? "model" : "tool") + " tokens: " + run[1] + '"></span>';
    }).join("");
    return '<div class="strip">' + spans + '</div><div class="legend">prompt ' + d.prompt_len + " tokens" +
      '<span class="sw m"></span>model tokens ' + model + '<span class="sw e"></span>tool tokens ' + tool + "</div>";
  }
  function result(r) {
    var bad = r.error || r.timed_out || (r.exit !== null && r.exit !== 0);
    var flags = [r.exit === null ? "no exit code" : "exit " + r.exit, num(r.dur, 3) + " s"];
    if (r.timed_out) flags.push('<span class="err">timed out</span>');
    if (r.truncated) flags.push("output truncated");
    if (r.error) flags.push('<span class="err">' + esc(r.error) + "</span>");
    if (r.done) flags.push("done");
    var label = tag("span", "lbl", "result of " + esc(r.call_id) + " (" + esc(r.name) + ")");
    var stderr = r.stderr ? tag("div", "lbl", "stderr") + pre(r.stderr) : "";
    return tag("div", "result" + (bad ? " fail" : ""), label + " " + flags.join(DOT) + pre(r.output) + stderr);
  }
  function signalHtml(s) {
    var where = s[2] === null ? "at grading" : "at turn " + s[2];
    return tag("div", "result fail signal", '<span class="flag">integrity: ' + esc(s[0]) + " x" + s[1] + " " + where +
      "</span>" + (s[3] ? pre(s[3]) : ""));
  }
  var SIGNALS = [];
  function turn(t) {
    var flags = ["finish " + esc(t.finish), "weights v" + t.wv, "gen " + num(t.gen_s, 3) + " s",
      "tools " + num(t.tool_s, 3) + " s", "tokens [" + t.start + ", " + (t.start + t.model_len + t.env_len) + ")"];
    if (t.cached) flags.push("cached " + t.cached);
    if (t.drift) flags.push('<span class="flag">template drift</span>');
    if (t.retok) flags.push('<span class="flag">re-tokenize mismatch</span>');
    var h = tag("div", "turn-h", "<b>turn " + t.i + "</b>" + DOT + flags.join(DOT));
    h += tag("div", "span span-model", tag("div", "lbl", "model" + DOT + t.model_len + " tokens") + pre(t.text));
    t.calls.forEach(function (c) {
      var label = tag("span", "lbl", "tool call " + esc(c.id));
      h += tag("div", "call", label + " <b>" + esc(c.name) + "</b>" + pre(c.args));
    });
    t.results.forEach(function (r) { h += result(r); });
    t.parse_errors.forEach(function (e) {
      h += tag("div", "result fail", tag("span", "err", "parse error") + pre(e));
    });
    SIGNALS.forEach(function (s) { if (s[2] === t.i) h += signalHtml(s); });
    if (t.env_len || t.obs) {
      h += tag("div", "span span-tool", tag("div", "lbl", "tool" + DOT + t.env_len + " tokens") + pre(t.obs));
    }
    return tag("div", "turn", h);
  }
  function testsHtml(t) {
    if (!t) return "<p>no test report</p>";
    var err = t.error ? DOT + tag("span", "err", esc(t.error)) : "";
    var items = t.outcomes.map(function (o) {
      return tag("li", o[1] ? "pass" : "fail", (o[1] ? "\u2713 " : "\u2717 ") + esc(o[0]) + (o[2] ? pre(o[2]) : ""));
    });
    return "<p>" + t.passed + "/" + t.total + " tests passed" + err + "</p>" + tag("ul", "tests", items.join(""));
  }

  function show(i) {
    selected = i;
    render();
    var el = document.getElementById("d" + i);
    if (!el) { detailEl.textContent = "details of this trajectory are not loaded yet"; return; }
    var d = JSON.parse(el.textContent), tm = d.timing;
    var h = "<h2>trajectory " + esc(d.id) + "</h2>" + kv([
      ["status", badge(d.status)], ["reward", num(d.reward)],
      ["reward components", '<span class="components">' + (d.components.length ? d.components.map(function (c) {
        return esc(c[0]) + " " + num(c[1]);
      }).join(", ") : "\u2013") + "</span>"],
      ["task", esc(d.task)], ["group", esc(d.group)], ["env", esc(d.env)], ["step", num(d.step)],
      ["sample", num(d.sample)], ["attempt", num(d.attempt)], ["turns", String(d.turns.length)],
      ["template drift turns", num(d.drift_count)], ["total", secs(tm.total_s)], ["generation", secs(tm.generation_s)],
      ["tools", secs(tm.tools_s)], ["setup", secs(tm.setup_s)], ["finalize", secs(tm.finalize_s)],
      ["sandbox wait", secs(tm.sandbox_wait_s)]]);
    if (d.error) h += '<p class="err">error: ' + esc(d.error) + "</p>";
    SIGNALS = d.integrity || [];
    if (SIGNALS.length) h += "<h3>integrity signals</h3>" + SIGNALS.map(signalHtml).join("");
    h += strip(d) + "<h3>turns</h3>" + d.turns.map(turn).join("");
    h += "<h3>tests</h3>" + testsHtml(d.tests);
    SIGNALS.forEach(function (s) { if (s[2] === null) h += signalHtml(s); });
    if (d.solution) h += "<h3>solution</h3>" + pre(d.solution);
    h += "<h3>meta</h3>" + pre(d.meta);
    detailEl.innerHTML = h;
    var hash = "#" + encodeURIComponent(d.id);
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }

  function move(delta) {
    var k = view.indexOf(selected) + delta;
    if (k < 0 || k >= view.length) return;
    show(view[k]);
    var top = k * ROW_H;
    if (top < vp.scrollTop) vp.scrollTop = top;
    else if (top + ROW_H > vp.scrollTop + vp.clientHeight) vp.scrollTop = top + ROW_H - vp.clientHeight;
  }

  body.addEventListener("click", function (e) {
    var row = e.target.closest(".row");
    if (row) show(parseInt(row.getAttribute("data-i"), 10));
  });
  vp.addEventListener("scroll", function () { window.requestAnimationFrame(render); });
  vp.addEventListener("keydown", function (e) {
    if (e.key === "ArrowDown" || e.key === "j") { move(1); e.preventDefault(); }
    if (e.key === "ArrowUp" || e.key === "k") { move(-1); e.preventDefault(); }
  });
  document.getElementById("thead").addEventListener("click", function (e) {
    var key = e.target.getAttribute("data-key");
    if (!key) return;
    if (sortKey === key) sortDir = -sortDir; else { sortKey = key; sortDir = 1; }
    header(); apply();
  });
  ["f-status", "f-step", "f-task", "f-id", "f-rmin", "f-rmax"].forEach(function (id) {
    document.getElementById(id).addEventListener("input", apply);
  });
  [["step-sel", ".stepblock"], ["snap-step-sel", ".snapblock"]].forEach(function (pair) {
    var sel = document.getElementById(pair[0]);
    if (!sel) return;
    sel.addEventListener("change", function () {
      document.querySelectorAll(pair[1]).forEach(function (b) {
        b.hidden = b.getAttribute("data-step") !== sel.value;
      });
    });
  });
  options("f-status", "status");
  options("f-step", "step");
  header();
  apply();
  window.agentrlReport = { show: show, apply: apply, renderedAt: performance.now(),
                           visibleCount: function () { return view.length; } };
  if (location.hash.length > 1) {
    var want = decodeURIComponent(location.hash.slice(1));
    var hit = ROWS.findIndex(function (r) { return r[C.id] === want; });
    if (hit >= 0) window.addEventListener("DOMContentLoaded", function () { show(hit); });
  }
})();
"""
