// Draws the perfcast report from the JSON block #perfcast-data.
// Trace text only ever reaches the page through textContent (tables) or through
// plotEscape() (plotly labels, which plotly reads as a small subset of HTML).
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("perfcast-data").textContent);
  var CONFIG = { displaylogo: false, responsive: true };
  var COLORS = {
    "annotation": "#b7c7a3",
    "cpu op": "#8fb3d9",
    "runtime": "#f2b45c",
    "wait": "#c9c9c9",
    "kernel": "#3d7f3d",
    "communication": "#c0504d",
    "copy": "#8064a2",
    "compute": "#3d7f3d",
    "idle": "#d0d4da",
    "data loading": "#9bbb59",
    "forward": "#4f81bd",
    "backward": "#4bacc6",  // not communication's red: both can stand in one legend
    "optimizer": "#f79646",
    "sync wait": "#c9c9c9",
    "gpu compute": "#3d7f3d",
    "gpu communication": "#c0504d",
    "gpu copy": "#8064a2",
    "latency": "#f2dc5c",
    "unexplained": "#e377c2",
    "cpu": "#8fb3d9",
    "launch": "#f2b45c",  // runtime calls, as in the timeline
    "other ranks": "#5b6770",
    "measured": "#4f81bd",
    "simulated": "#f79646"
  };
  var FONT = {
    family: "system-ui, -apple-system, Segoe UI, Roboto, Helvetica Neue, Arial, sans-serif",
    size: 12
  };

  // ---- helpers -------------------------------------------------------------------------

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (Object.prototype.hasOwnProperty.call(attrs, k)) {
          node.setAttribute(k, attrs[k]);
        }
      }
    }
    if (text !== undefined && text !== null) {
      node.textContent = String(text);
    }
    return node;
  }

  function add(parent, child) {
    parent.appendChild(child);
    return child;
  }

  function body(id) {
    var node = document.getElementById(id + "-body");
    node.textContent = "";
    return node;
  }

  function ms(x, digits) {
    if (x === null || x === undefined || isNaN(x)) {
      return "-";
    }
    var d = digits === undefined ? 2 : digits;
    // toFixed rounds the binary value, as the terminal's Python does (259.005 is 259.00 in
    // both); toLocaleString rounded the decimal text up. Then the thousands separators.
    var parts = Number(x).toFixed(d).split(".");
    parts[0] = parts[0].replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    return parts.join(".");
  }

  function pct(x, digits) {
    return x === null || x === undefined ? "-" : ms(x, digits === undefined ? 1 : digits) + "%";
  }

  function signedPct(x) {
    return x === null || x === undefined ? "-" : (x >= 0 ? "+" : "") + ms(x, 2) + "%";
  }

  // Plotly renders labels and hover text as a subset of HTML: escape trace text for it.
  function plotEscape(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function shorten(s, n) {
    s = String(s);
    return s.length <= n ? s : s.slice(0, n - 1) + "…";
  }

  // A kernel or op name as a table shows it: CUDA's "void " dropped, and a long one with its
  // template and parameter lists folded ("fbgemm_gpu::kernel<…>(…)"); the full name is the
  // cell's tooltip.
  function nameCell(name, n) {
    var full = String(name);
    var s = full.replace(/^void /, "");
    if (s.length > n) {
      var out = "";
      var depth = 0;
      for (var i = 0; i < s.length; i++) {
        var ch = s[i];
        if (ch === "<" || ch === "(") {
          if (depth === 0) {
            out += ch + "…";
          }
          depth += 1;
        } else if ((ch === ">" || ch === ")") && depth > 0) {
          depth -= 1;
          if (depth === 0) {
            out += ch;
          }
        } else if (depth === 0) {
          out += ch;
        }
      }
      s = out;
    }
    return el("span", { title: full }, shorten(s, n));
  }

  function stepLabel(name) {
    return String(name).replace(/^ProfilerStep#/, "step ");
  }

  function caption(parent, text, cls) {
    return add(parent, el("p", { "class": cls || "caption" }, text));
  }

  // columns: [{label, num, cls}], rows: arrays of cell values (string, number or Node)
  function table(parent, columns, rows, rowClass) {
    var wrap = add(parent, el("div", { "class": "scroll" }));
    var t = add(wrap, el("table", { "class": "data" }));
    var tr = add(add(t, el("thead")), el("tr"));
    columns.forEach(function (c) {
      add(tr, el("th", c.num ? { "class": "num" } : null, c.label));
    });
    var tbody = add(t, el("tbody"));
    rows.forEach(function (row, i) {
      var r = add(tbody, el("tr", rowClass && rowClass(i) ? { "class": rowClass(i) } : null));
      row.forEach(function (v, j) {
        var c = columns[j];
        var td = add(r, el("td", c.num ? { "class": "num" } : c.cls ? { "class": c.cls } : null));
        if (v instanceof Node) {
          td.appendChild(v);
        } else {
          td.textContent = v === null || v === undefined ? "-" : String(v);
        }
      });
    });
    return t;
  }

  function list(items) {
    var ul = el("ul");
    items.forEach(function (s) {
      add(ul, el("li", null, s));
    });
    return ul;
  }

  function chart(parent, id, traces, layout, height, config) {
    var title = layout && layout.title ? (layout.title.text || layout.title) : id;
    var div = add(parent, el("div", {
      "class": "chart", id: id, role: "img", "aria-label": "chart: " + String(title)
    }));
    var base = {
      font: FONT,
      height: height || 360,
      margin: { l: 60, r: 20, t: 30, b: 60 },
      paper_bgcolor: "#fff",
      plot_bgcolor: "#fff",
      legend: { orientation: "h", y: -0.18, traceorder: "normal" },
      hoverlabel: { namelength: -1 }
    };
    for (var k in layout) {
      if (Object.prototype.hasOwnProperty.call(layout, k)) {
        base[k] = layout[k];
      }
    }
    Plotly.newPlot(div, traces, base, config || CONFIG);
    return div;
  }

  // One bar per step (x), one stacked series per part, values in ms.
  function stepBars(name, x, y, color) {
    return {
      type: "bar", name: name, x: x, y: y, marker: { color: color },
      hovertemplate: "%{x}<br>" + name + ": %{y:.3f} ms<extra></extra>"
    };
  }

  function stackedStepChart(parent, id, x, traces, yTitle) {
    // A series that is zero in every step only lengthens the legend.
    var shown = traces.filter(function (t) {
      return t.y.some(function (v) { return v > 0.0005; });
    });
    return chart(parent, id, shown.length ? shown : traces, {
      barmode: "stack",
      bargap: x.length === 1 ? 0.8 : x.length < 4 ? 0.6 : 0.2,
      yaxis: { title: { text: yTitle } },
      xaxis: { type: "category", automargin: true }
    });
  }

  function median(xs) {
    if (!xs.length) {
      return null;
    }
    var s = xs.slice().sort(function (a, b) { return a - b; });
    var m = (s.length - 1) / 2;
    return (s[Math.floor(m)] + s[Math.ceil(m)]) / 2;
  }

  function mean(xs) {
    if (!xs.length) {
      return null;
    }
    return xs.reduce(function (a, b) { return a + b; }, 0) / xs.length;
  }

  var RANKS = DATA.summary.ranks;
  var MULTI = RANKS.length > 1;
  var REPLAY = {};
  if (DATA.replay) {
    DATA.replay.ranks.forEach(function (r) {
      REPLAY[r.rank] = r.iterations;
    });
  }

  // x labels shared by the per-step charts
  function stepKey(rank, name) {
    return plotEscape((MULTI ? "r" + rank + " · " : "") + stepLabel(name));
  }

  // ---- summary ---------------------------------------------------------------------------

  function renderSummary() {
    var root = body("summary");
    // --keep-profiler-cost: there is no estimate without the profiler to show.
    var keptCost = !!(DATA.replay && DATA.replay.correction &&
      DATA.replay.correction.source === "off");
    var rows = RANKS.map(function (rs) {
      var times = rs.iterations.map(function (it) { return it.measured_ms; });
      var rep = REPLAY[rs.rank] || [];
      var sim = rep.map(function (it) { return it.simulated_ms; });
      var real = rep.filter(function (it) { return it.real_ms !== null && it.real_ms !== undefined; })
        .map(function (it) { return it.real_ms; });
      var err = rep.map(function (it) { return Math.abs(it.error_pct); });
      return [
        String(rs.rank),
        rs.device || "-",
        rs.path.split("/").pop(),
        String(rs.iterations.length) + (rs.has_steps ? "" : " (whole trace)"),
        ms(mean(times)),
        ms(median(times)),
        ms(times.length ? Math.min.apply(null, times) : null),
        ms(times.length ? Math.max.apply(null, times) : null),
        ms(mean(sim)),
        err.length ? pct(Math.max.apply(null, err), 2) : "-",
        real.length && !keptCost ? ms(mean(real)) : "-"
      ];
    });
    table(root, [
      { label: "rank" }, { label: "device" }, { label: "file", cls: "name" },
      { label: "steps", num: true }, { label: "mean ms", num: true },
      { label: "median ms", num: true }, { label: "min ms", num: true },
      { label: "max ms", num: true }, { label: "simulated mean ms", num: true },
      { label: "worst replay error", num: true },
      { label: "without profiler, mean ms", num: true }
    ], rows);
    caption(root, "A step runs from the previous step's completion to its own (CPU range ended " +
      "and its GPU work done), so step times add up to the total. Simulated: the same steps " +
      "replayed by the perfcast simulator, with measured durations.");
    if (DATA.replay) {
      var r = DATA.replay;
      caption(root, r.nodes.toLocaleString("en-US") + " graph nodes replayed; " +
        r.unresolved_dependencies.toLocaleString("en-US") +
        " dependencies resolved by heuristic; worst step error " +
        pct(r.max_abs_error_pct, 2) + ".");
      if (r.correction && r.correction.source === "off") {
        caption(root, "The profiler's own cost is kept in (--keep-profiler-cost): every figure " +
          "and prediction here is for the profiled run, as traced.");
      } else if (r.correction) {
        var c = r.correction;
        var costs = [ms(c.op_us) + " µs per op"];
        [[c.input_us, "per recorded input"], [c.runtime_us, "per runtime call"],
          [c.task_us, "per GPU task a runtime call launches beyond its first"],
          [c.python_us, "per Python frame"], [c.memory_us, "per [memory] event"]]
          .forEach(function (x) {
            if (x[0] > 0.005) {
              costs.push(ms(x[0]) + " µs " + x[1]);
            }
          });
        if (c.work_pct > 0) {
          costs.push("the ops' own CPU work taken as " + ms(c.work_pct, 1) + "% longer traced");
        }
        caption(root, "Without profiler: the step as it runs with the profiler off, estimated by " +
          "replaying the trace with the profiler's own host cost taken out (" +
          c.source + ", ±" + c.uncertainty_pct.toFixed(0) + "%: " + costs.join(", ") + "; " +
          ms(c.removed_ms_per_step) + " ms of host time per step" +
          (c.note ? "; " + c.note : "") + "). Predictions below are for that run.");
      }
      if (r.assumptions && r.assumptions.length) {
        var d = add(root, el("details"));
        add(d, el("summary", null, "replay assumptions (" + r.assumptions.length + ")"));
        d.appendChild(list(r.assumptions));
      }
    }
    RANKS.forEach(function (rs, i) {
      var det = add(root, el("details"));
      if (i === 0 && RANKS.length <= 2) {
        det.open = true;
      }
      add(det, el("summary", null, "steps of rank " + rs.rank));
      var rep = {};
      (REPLAY[rs.rank] || []).forEach(function (it) { rep[it.name] = it; });
      var rows2 = rs.iterations.map(function (it) {
        var g = it.gpu;
        var s = rep[it.name];
        return [
          stepLabel(it.name), ms(it.measured_ms), s ? ms(s.simulated_ms) : "-",
          s ? signedPct(s.error_pct) : "-",
          s && !keptCost && s.real_ms !== null && s.real_ms !== undefined ? ms(s.real_ms) : "-",
          g ? ms(g.compute_ms) : "-", g ? ms(g.communication_exposed_ms) : "-",
          g ? ms(g.memcpy_exposed_ms) : "-", g ? ms(g.idle_ms) : "-",
          g ? pct(g.communication_overlap_pct, 0) : "-", String(it.kernels)
        ];
      });
      table(det, [
        { label: "step" }, { label: "measured ms", num: true },
        { label: "simulated ms", num: true }, { label: "error", num: true },
        { label: "without profiler ms", num: true }, { label: "GPU compute", num: true }, { label: "comm exposed", num: true },
        { label: "copies exposed", num: true }, { label: "idle", num: true },
        { label: "comm overlap", num: true }, { label: "kernels", num: true }
      ], rows2);
    });
  }

  // ---- verdict: the answers the rest of the page explains ----------------------------------

  function renderVerdict() {
    var root = body("verdict");
    var A = DATA.advice;
    var card = add(root, el("div", { "class": "verdict" }));
    function line(label, parts) {
      var p = add(card, el("p"));
      add(p, el("span", { "class": "label" }, label));
      parts.forEach(function (x) {
        add(p, typeof x === "string" ? document.createTextNode(x) : x);
      });
      return p;
    }
    if (!A) {
      var times = [];
      RANKS.forEach(function (rs) {
        rs.iterations.forEach(function (it) { times.push(it.measured_ms); });
      });
      line("step", [el("b", null, ms(median(times)) + " ms"),
        " median as traced (no advice on this trace: the notes above say why)"]);
      return;
    }
    (DATA.caveats || []).forEach(function (n) {
      line("caution", [n]);
    });
    var kept = A.correction.source === "off";
    line("step", kept
      ? [el("b", null, ms(A.traced_ms) + " ms"), " as traced (the profiler's cost kept in)"]
      : [el("b", null, ms(A.baseline_ms) + " ms"), " without the profiler (" +
        A.correction.source + " estimate" + (A.correction.source !== "fit" ||
          A.correction.uncertainty_pct > 5.5 ? ", ±" + A.correction.uncertainty_pct.toFixed(0) +
          "%" : "") + "); " + ms(A.traced_ms) + " ms as traced"]);
    line("what bounds it", [A.bottleneck]);
    (A.findings || []).forEach(function (f) {
      line("finding", [f]);
    });
    var paths = DATA.replay ? DATA.replay.critical_paths : [];
    if (paths.length) {
      var by = {};
      var total = 0;
      paths.forEach(function (p) {
        Object.keys(p.by_category_ms).forEach(function (c) {
          by[c] = (by[c] || 0) + p.by_category_ms[c];
          total += p.by_category_ms[c];
        });
      });
      var cats = Object.keys(by).sort(function (a, b) { return by[b] - by[a]; })
        .filter(function (c) { return total > 0 && by[c] / total >= 0.05; }).slice(0, 3);
      if (cats.length) {
        line("critical path", [cats.map(function (c) {
          return pct(100 * by[c] / total, 0) + " " + c;
        }).join(", ")]);
      }
    }
    var S = A.suggestions.filter(function (s) { return s.gain_ms > 0; });
    if (S.length) {
      var best = S[0];
      line("best change", [el("b", null, best.name), " → " + ms(best.predicted_ms) + " ms (" +
        ms(best.speedup, 2) + "×" + (best.speedup_low !== null && best.speedup_low !== undefined
          ? ", measured error range " + bandText(best) : "") + ")" +
        (best.code ? ": " : ""), best.code ? el("code", null, best.code) : ""]);
      if (A.plan && A.plan.specs.length > 1) {
        line("best plan", [A.plan.specs.join(" + ") + " → ", el("b", null,
          ms(A.plan.predicted_ms) + " ms (" + ms(A.plan.speedup, 2) + "×)")]);
      }
    } else {
      line("best change", [A.uncertain && A.uncertain.length
        ? "none gains more than its model's measured error (" + A.uncertain.length +
          " predicted, not ranked: see Suggested optimizations)"
        : "no optimization perfcast models applies to this trace"]);
    }
    if (DATA.replay) {
      line("replay check", ["the unmodified trace replays within " +
        pct(DATA.replay.max_abs_error_pct, 2) + " per step (worst step)"]);
    }
  }

  // ---- breakdown -------------------------------------------------------------------------

  function renderBreakdown() {
    var root = body("breakdown");
    var x = [];
    var parts = {
      compute: [], "communication exposed": [], "copies exposed": [], idle: []
    };
    var cpu = { "data loading": [], forward: [], backward: [], optimizer: [], communication: [] };
    var hasGpu = false;
    RANKS.forEach(function (rs) {
      rs.iterations.forEach(function (it) {
        x.push(stepKey(rs.rank, it.name));
        var g = it.gpu;
        hasGpu = hasGpu || !!g;
        parts.compute.push(g ? g.compute_ms : null);
        parts["communication exposed"].push(g ? g.communication_exposed_ms : null);
        parts["copies exposed"].push(g ? g.memcpy_exposed_ms : null);
        parts.idle.push(g ? g.idle_ms : null);
        cpu["data loading"].push(it.cpu.dataloader_ms);
        cpu.forward.push(it.cpu.forward_ms);
        cpu.backward.push(it.cpu.backward_ms);
        cpu.optimizer.push(it.cpu.optimizer_ms);
        cpu.communication.push(it.cpu.communication_ms);
      });
    });
    if (!x.length) {
      caption(root, "No steps in this trace.", "empty");
      return;
    }
    add(root, el("h3", null, "GPU time per step"));
    if (hasGpu) {
      var gcol = {
        compute: COLORS.compute, "communication exposed": COLORS.communication,
        "copies exposed": COLORS.copy, idle: COLORS.idle
      };
      stackedStepChart(root, "chart-breakdown-gpu", x, Object.keys(parts).map(function (k) {
        return stepBars(k, x, parts[k], gcol[k]);
      }), "ms");
      caption(root, "Compute: any non-communication kernel running. Communication and copies " +
        "count only where not hidden by compute. Idle: nothing on any stream. The four add up " +
        "to the step time, split by time: GPU work of the next step that starts before a step " +
        "ends counts in that step (the last step has none after it).");
    } else {
      caption(root, "No GPU work in this trace.", "empty");
    }
    add(root, el("h3", null, "CPU time per step, by phase"));
    var ccol = {
      "data loading": COLORS["data loading"], forward: COLORS.forward,
      backward: COLORS.backward, optimizer: COLORS.optimizer,
      communication: COLORS.communication  // red in every chart and the timeline
    };
    stackedStepChart(root, "chart-breakdown-cpu", x, Object.keys(cpu).map(function (k) {
      return stepBars(k, x, cpu[k], ccol[k]);
    }), "CPU ms (summed over threads)");
    // As the terminal's summary says: these are the profiled run's times, while the step
    // figures above and the predictions are without the profiler.
    caption(root, "CPU time of the outermost events of each phase, per thread: two threads " +
      "busy at once count twice. As traced: the profiler's own cost is included.");
  }

  // ---- timeline --------------------------------------------------------------------------

  function renderTimeline() {
    var root = body("timeline");
    var T = DATA.timeline;
    if (!T) {
      caption(root, "No step to show.", "empty");
      return;
    }
    var cats = DATA.categories;
    var groups = [["measured", T.measured, "y"]];
    if (T.simulated) {
      groups.push(["simulated", T.simulated, "y2"]);
    }
    var head = "Rank " + T.rank + ", " + stepLabel(T.iteration) +
      (T.steps_on_rank > 1 ? " (the median-length of " + T.steps_on_rank + " steps)" : "") +
      ": measured " + ms(T.measured.window_ms) + " ms" +
      (T.simulated ? ", simulated " + ms(T.simulated.window_ms) + " ms" : "") + ".";
    add(root, el("p", { "class": "headline" }, head));
    var capped = groups.filter(function (g) { return g[1].shown < g[1].total; });
    if (capped.length) {
      add(root, el("p", { "class": "note" }, capped.map(function (g) {
        return g[0] + ": showing " + g[1].shown.toLocaleString("en-US") + " of " +
          g[1].total.toLocaleString("en-US") + " bars";
      }).join("; ") + " (at most " + T.max_bars.toLocaleString("en-US") +
        " per group, so the page stays fast: every lane keeps its longest bars of each kind " +
        "(kernels, copies, ...) up to an equal share, the rest go to the longest overall). " +
        "Use Perfetto for every event."));
    }
    var traces = [];
    var seen = {};
    groups.forEach(function (g) {
      var label = g[0];
      var G = g[1];
      var lanes = G.lanes.map(function (l) { return plotEscape(shorten(l, 48)); });
      var byCat = {};
      for (var i = 0; i < G.lane.length; i++) {
        var c = G.cat[i];
        var b = byCat[c] || (byCat[c] = { x: [], base: [], y: [], text: [] });
        b.x.push(G.dur[i]);
        b.base.push(G.start[i]);
        b.y.push(lanes[G.lane[i]]);
        b.text.push(plotEscape(shorten(T.names[G.name[i]], 160)) + "<br>" +
          ms(G.start[i], 3) + " → " + ms(G.start[i] + G.dur[i], 3) + " ms (" +
          ms(G.dur[i] * 1000, 1) + " µs)");
      }
      Object.keys(byCat).sort(function (a, b) { return a - b; }).forEach(function (c) {
        var name = cats[c];
        var b = byCat[c];
        traces.push({
          type: "bar", orientation: "h", name: name, legendgroup: name,
          showlegend: !seen[name], x: b.x, base: b.base, y: b.y, yaxis: g[2],
          hovertext: b.text, hoverinfo: "text", marker: { color: COLORS[name] || "#888" },
          width: 0.8
        });
        seen[name] = true;
      });
      // Lanes with no bar left after the cap still get their row.
      traces.push({
        type: "scatter", mode: "markers", x: lanes.map(function () { return 0; }), y: lanes,
        yaxis: g[2], marker: { opacity: 0 }, hoverinfo: "skip", showlegend: false
      });
    });
    var nm = T.measured.lanes.length;
    var ns = T.simulated ? T.simulated.lanes.length : 0;
    var rowPx = 24;
    var plotPx = (Math.max(nm, 1) + ns) * rowPx + (ns ? 40 : 0);
    var height = plotPx + 130;
    var split = ns ? (ns * rowPx) / plotPx : 0;
    var gap = ns ? 40 / plotPx : 0;
    var xmax = Math.max(T.measured.window_ms, T.simulated ? T.simulated.window_ms : 0);
    var yaxis = {
      type: "category", autorange: "reversed", automargin: true, fixedrange: true,
      domain: [ns ? split + gap : 0, 1], categoryorder: "array",
      categoryarray: T.measured.lanes.map(function (l) { return plotEscape(shorten(l, 48)); })
    };
    var layout = {
      barmode: "overlay",
      bargap: 0.15,
      margin: { l: 40, r: 20, t: 30, b: 100 },
      xaxis: { title: { text: "ms from the start of the step" }, range: [0, xmax], zeroline: false,
        anchor: ns ? "y2" : "y" },
      yaxis: yaxis,
      legend: { orientation: "h", x: 0, y: -70 / plotPx, yanchor: "top" },
      annotations: [{
        text: "<b>measured</b>", xref: "paper", yref: "paper", x: 0, xanchor: "left",
        y: 1, yanchor: "bottom", showarrow: false
      }]
    };
    if (ns) {
      layout.yaxis2 = {
        type: "category", autorange: "reversed", automargin: true, fixedrange: true,
        domain: [0, split], categoryorder: "array",
        categoryarray: T.simulated.lanes.map(function (l) { return plotEscape(shorten(l, 48)); })
      };
      layout.annotations.push({
        text: "<b>simulated</b>", xref: "paper", yref: "paper", x: 0, xanchor: "left",
        y: split, yanchor: "bottom", showarrow: false
      });
    }
    if (!nm) {
      layout.annotations.push({
        text: "no CPU ops, runtime calls or GPU work recorded in this window", xref: "paper",
        yref: "paper", x: 0.5, y: 1, yanchor: "top", showarrow: false, font: { color: "#5d6875" }
      });
    }
    chart(root, "chart-timeline", traces, layout, height);
    // A collective's measured bar holds its wait for the other ranks; the simulator makes
    // that wait a dependency, so its bar starts later and is shorter, ending where it did.
    var comm = cats.indexOf("communication");
    var collectives = T.simulated && T.simulated.cat.indexOf(comm) >= 0;
    caption(root, "Drag to zoom, double-click to reset; hover a bar for its name. Both groups " +
      "start at their own step start. Measured CPU lanes show outermost record_function " +
      "annotations, ops two levels deep and runtime calls; simulated CPU lanes interleave op work and runtime calls " +
      "as the simulator replays them." + (collectives ? " A collective's simulated bar starts " +
      "when the last rank reaches it: the time its measured bar spent waiting for the other " +
      "ranks is a dependency in the simulation, not part of the kernel." : ""));
  }

  // ---- top kernels and ops ---------------------------------------------------------------

  function topTable(parent, title, rows) {
    add(parent, el("h3", null, title));
    if (!rows.length) {
      caption(parent, "none", "empty");
      return;
    }
    table(parent, [
      { label: "total ms", num: true }, { label: "%", num: true }, { label: "count", num: true },
      { label: "name", cls: "name" }
    ], rows.map(function (r) {
      return [ms(r.total_ms, r.total_ms < 1 ? 3 : 2), ms(r.pct, 1),
        r.count.toLocaleString("en-US"), nameCell(r.name, 100)];
    }));
  }

  function renderTop() {
    var root = body("top");
    caption(root, "Summed over the steps. Kernels: % of all kernel time. Ops: outermost CPU " +
      "ops only, so nested calls are not counted twice; % of their CPU time, as traced (the " +
      "profiler's own cost included).");
    RANKS.forEach(function (rs, i) {
      var parent = root;
      if (MULTI) {
        parent = add(root, el("details"));
        parent.open = i === 0;
        add(parent, el("summary", null, "rank " + rs.rank));
      }
      var grid = add(parent, el("div", { "class": "grid2" }));
      topTable(add(grid, el("div")), "top kernels", rs.top_kernels);
      topTable(add(grid, el("div")), "top CPU ops", rs.top_ops);
    });
  }

  // ---- critical path ---------------------------------------------------------------------

  function renderCritical() {
    var root = body("critical-path");
    var paths = DATA.replay ? DATA.replay.critical_paths : [];
    if (!paths.length) {
      caption(root, DATA.replay ? "No step to analyse." : "The trace was not replayed.", "empty");
      return;
    }
    var cats = Object.keys(paths[0].by_category_ms);
    var x = paths.map(function (p) { return stepKey(p.rank, p.iteration); });
    var traces = cats.map(function (c) {
      var y = paths.map(function (p) { return p.by_category_ms[c] || 0; });
      return stepBars(c, x, y, COLORS[c] || "#888");
    }).filter(function (t) {
      return t.y.some(function (v) { return v > 0.0005; });
    });
    add(root, el("h3", null, "Time on the critical path, by category"));
    stackedStepChart(root, "chart-critical-path", x, traces, "ms");
    var corrected = DATA.replay.correction && DATA.replay.correction.source !== "off";
    caption(root, "The chain of work and waits that sets each simulated step's time" +
      (corrected ? ", in the run without the profiler (its own host cost taken out, so the " +
        "bars add up to the step without the profiler, not to the traced step)" : "") +
      ": what would have to get faster for the step to get faster.");
    var agg = {};
    paths.forEach(function (p) {
      p.top_items.forEach(function (item) {
        var key = item[0] + "\u0000" + item[1];
        var a = agg[key] || (agg[key] = { cat: item[0], name: item[1], ms: 0, steps: 0 });
        a.ms += item[2];
        a.steps += 1;
      });
    });
    var items = Object.keys(agg).map(function (k) { return agg[k]; });
    items.sort(function (a, b) { return b.ms - a.ms; });
    add(root, el("h3", null, "Top items on the critical path"));
    table(root, [
      { label: "ms per step", num: true }, { label: "in steps", num: true },
      { label: "category" }, { label: "name", cls: "name" }
    ], items.slice(0, 15).map(function (a) {
      return [ms(a.ms / paths.length, 3), a.steps + " of " + paths.length, a.cat,
        nameCell(a.name, 100)];
    }));
    caption(root, "From the top items of each step's path, averaged over " + paths.length +
      " step" + (paths.length === 1 ? "" : "s") + (MULTI ? " of all ranks" : "") + ".");
  }

  // ---- advice ----------------------------------------------------------------------------

  function renderAdvice() {
    var root = body("advice");
    var A = DATA.advice;
    if (!A) {
      caption(root, "No advice: the trace was not replayed.", "empty");
      return;
    }
    var head = add(root, el("p", { "class": "headline" }));
    add(head, document.createTextNode("Traced "));
    add(head, el("b", null, ms(A.traced_ms) + " ms"));
    if (A.correction.source === "off") {
      add(head, document.createTextNode(" per step, the profiler's cost kept in: predictions " +
        "are for the profiled run"));
    } else {
      add(head, document.createTextNode(" per step; without the profiler "));
      add(head, el("b", null, ms(A.baseline_ms) + " ms"));
      add(head, document.createTextNode(" (" + A.correction.source + ")"));
    }
    add(head, document.createTextNode(". Bottleneck: " + A.bottleneck + "."));
    (A.findings || []).forEach(function (f) {
      caption(root, "Finding: " + f + ".", "note");
    });
    var S = A.suggestions;
    if (!S.length) {
      caption(root, A.uncertain && A.uncertain.length
        ? "No optimization gains more than its model's measured error; see the unranked ones below."
        : "No optimization applies to this trace.", "empty");
    } else {
      var names = S.map(function (s, i) { return plotEscape((i + 1) + ". " + s.name); });
      chart(root, "chart-advice", [{
        type: "bar", orientation: "h", y: names, x: S.map(function (s) { return s.predicted_ms; }),
        marker: { color: S.map(function (s) { return s.gain_ms > 0 ? "#3d7f3d" : "#c9c9c9"; }) },
        // The step times the measured error range allows: baseline / speedup_high .. _low.
        error_x: {
          type: "data", symmetric: false, color: "#1d232b", thickness: 1.2, width: 4,
          array: S.map(function (s) {
            return s.speedup_low ? A.baseline_ms / s.speedup_low - s.predicted_ms : 0;
          }),
          arrayminus: S.map(function (s) {
            return s.speedup_high ? s.predicted_ms - A.baseline_ms / s.speedup_high : 0;
          })
        },
        hovertemplate: "%{y}: %{x:.2f} ms<extra></extra>", name: "predicted"
      }], {
        yaxis: { type: "category", autorange: "reversed", automargin: true },
        xaxis: { title: { text: "predicted ms per step" }, rangemode: "tozero" },
        showlegend: false,
        margin: { l: 40, r: 20, t: 20, b: 50 },
        shapes: [{
          type: "line", xref: "x", yref: "paper", x0: A.baseline_ms, x1: A.baseline_ms,
          y0: 0, y1: 1, line: { color: "#1d232b", dash: "dot", width: 1.5 }
        }],
        annotations: [{
          xref: "x", yref: "paper", x: A.baseline_ms, y: 1, yanchor: "bottom",
          text: A.correction.source === "off" ? "baseline as traced" : "baseline without the profiler",
          showarrow: false, font: { size: 11 }
        }]
      }, Math.max(160, 34 * S.length + 90), { displaylogo: false, responsive: true,
        displayModeBar: false });
      table(root, [
        { label: "#", num: true }, { label: "optimization" }, { label: "predicted ms", num: true },
        { label: "speedup", num: true }, { label: "measured error range", num: true },
        { label: "gain ms", num: true }, { label: "from trace", num: true },
        { label: "why, where, assumptions" }, { label: "change", cls: "code" }
      ], S.map(function (s, i) {
        return [
          String(i + 1), s.name, ms(s.predicted_ms),
          s.speedup === null ? "-" : ms(s.speedup, 2) + "×", bandCell(s), ms(s.gain_ms),
          pct(100 * s.measured_share, 0), whyAndWhere(s), s.code || "-"
        ];
      }), function (i) { return i === 0 && S[0].gain_ms > 0 ? "best" : null; });
      caption(root, "Whiskers on the bars: the step times the measured error range allows. " +
        "Measured error range: the speedup range this model's largest error on the " +
        "project's measured GPU pairs allows. From trace: how much of the predicted critical " +
        "path keeps durations from the trace (the rest is scaled or modelled).");
    }
    if (A.plan) {
      var plan = add(root, el("p", { "class": "headline" }));
      add(plan, document.createTextNode("Best plan, together: " + A.plan.specs.join(" + ") +
        " → "));
      add(plan, el("b", null, ms(A.plan.predicted_ms) + " ms (" + ms(A.plan.speedup, 2) + "×)"));
      if (A.plan.code.length) {
        root.appendChild(list(A.plan.code));
      }
      if (A.plan.enablers && A.plan.enablers.length) {
        caption(root, "With " + A.plan.enablers.join(", ") + ": no gain alone, but the plan " +
          "needs it (a host sync splits a CUDA graph capture).");
      }
      if (A.plan.left_out && A.plan.left_out.length) {
        caption(root, "Left out, adding under 1% on top: " + A.plan.left_out.join(", ") + ".");
      }
    }
    if (A.uncertain && A.uncertain.length) {
      var unc = add(root, el("details"));
      add(unc, el("summary", null, "predicted, not ranked (" + A.uncertain.length + ")"));
      table(unc, [{ label: "optimization" }, { label: "speedup", num: true },
        { label: "why not ranked" }],
        A.uncertain.map(function (u) { return [u.name, ms(u.speedup, 2) + "×", u.uncertain]; }));
    }
    if (A.not_applicable.length) {
      var det = add(root, el("details"));
      add(det, el("summary", null, "not applicable (" + A.not_applicable.length + ")"));
      table(det, [{ label: "optimization" }, { label: "why not" }],
        A.not_applicable.map(function (n) { return [n.name, n.reason]; }));
    }
  }

  function bandText(s) {
    if (s.speedup_low === null || s.speedup_low === undefined) {
      return "-";
    }
    return ms(s.speedup_low, 2) + "–" + ms(s.speedup_high, 2) + "× (" + bandPairs(s) + ")";
  }

  function bandPairs(s) {
    return s.band_pairs ? s.band_pairs + " pairs" : "no pairs of this model";
  }

  // In the table, the range and under it how many pairs it rests on: on one line the column
  // pushed the suggestions table past the page's width, the code change behind a scrollbar.
  function bandCell(s) {
    if (s.speedup_low === null || s.speedup_low === undefined) {
      return "-";
    }
    var cell = el("span", null, ms(s.speedup_low, 2) + "–" + ms(s.speedup_high, 2) + "×");
    add(cell, el("br"));
    add(cell, el("span", { "class": "pairs" }, "(" + bandPairs(s) + ")"));
    return cell;
  }

  // The reason for a suggestion, then where its gain comes from (module · line · op).
  // The model's assumptions fold under it: in a column of their own they made every row
  // a screen tall and pushed the table past the page's width.
  function whyAndWhere(s) {
    var div = el("div", { "class": "why" }, s.explanation || (s.where && s.where.length ? "" : "-"));
    if (s.where && s.where.length) {
      var ul = add(div, el("ul", { "class": "where" }));
      s.where.forEach(function (w) {
        var place = [w.module, w.source, w.op].filter(function (x) { return x; }).join(" · ");
        add(ul, el("li", null, pct(100 * w.share, 0) + " " + (place || w.path)));
      });
    }
    if (s.assumptions && s.assumptions.length) {
      var det = add(div, el("details"));
      add(det, el("summary", null, "assumptions (" + s.assumptions.length + ")"));
      det.appendChild(list(s.assumptions));
    }
    return div;
  }

  // ---- ranks -----------------------------------------------------------------------------

  // Each rank's mean step split as the breakdown splits it: a rank that computes longer
  // than the others (load imbalance) tells apart from one that waits (exposed communication).
  function renderRankSplit(root, x) {
    var parts = [
      ["compute", "compute_ms", COLORS.compute],
      ["communication exposed", "communication_exposed_ms", COLORS.communication],
      ["copies exposed", "memcpy_exposed_ms", COLORS.copy],
      ["idle", "idle_ms", COLORS.idle]
    ];
    var withGpu = RANKS.filter(function (rs) {
      return rs.iterations.some(function (it) { return it.gpu; });
    });
    if (withGpu.length !== RANKS.length) {
      return;
    }
    var split = parts.map(function (p) {
      return RANKS.map(function (rs) {
        return mean(rs.iterations.filter(function (it) { return it.gpu; })
          .map(function (it) { return it.gpu[p[1]]; }));
      });
    });
    add(root, el("h3", null, "GPU time per rank, split (mean per step)"));
    stackedStepChart(root, "chart-ranks-split", x, parts.map(function (p, k) {
      return stepBars(p[0], x, split[k], p[2]);
    }), "ms");
    var spread = parts.slice(0, 2).map(function (p, k) {
      var v = split[k];
      var lo = Math.min.apply(null, v);
      var hi = Math.max.apply(null, v);
      return p[0] + " " + ms(lo) + "–" + ms(hi) + " ms (median " + ms(median(v)) + ", longest " +
        x[v.indexOf(hi)] + ")";
    });
    caption(root, "Across ranks: " + spread.join("; ") + ". Ranks whose compute is longer " +
      "make the others wait: their wait shows as exposed communication on the other ranks.");
  }

  function renderRanks() {
    var root = body("ranks");
    if (!MULTI) {
      caption(root, RANKS.length ? "Single rank (rank " + RANKS[0].rank + "): nothing to " +
        "compare across ranks." : "No ranks.", "empty");
      return;
    }
    var x = RANKS.map(function (rs) { return "rank " + rs.rank; });
    var meas = RANKS.map(function (rs) {
      return mean(rs.iterations.map(function (it) { return it.measured_ms; }));
    });
    var lo = RANKS.map(function (rs, i) {
      var t = rs.iterations.map(function (it) { return it.measured_ms; });
      return t.length ? meas[i] - Math.min.apply(null, t) : 0;
    });
    var hi = RANKS.map(function (rs, i) {
      var t = rs.iterations.map(function (it) { return it.measured_ms; });
      return t.length ? Math.max.apply(null, t) - meas[i] : 0;
    });
    var traces = [{
      type: "bar", name: "measured (mean, min to max)", x: x, y: meas,
      marker: { color: COLORS.measured },
      error_y: { type: "data", symmetric: false, array: hi, arrayminus: lo, color: "#333" },
      hovertemplate: "%{x}: %{y:.2f} ms<extra>measured</extra>"
    }];
    if (DATA.replay) {
      traces.push({
        type: "bar", name: "simulated (mean)", x: x,
        y: RANKS.map(function (rs) {
          return mean((REPLAY[rs.rank] || []).map(function (it) { return it.simulated_ms; }));
        }),
        marker: { color: COLORS.simulated },
        hovertemplate: "%{x}: %{y:.2f} ms<extra>simulated</extra>"
      });
    }
    chart(root, "chart-ranks", traces, {
      barmode: "group",
      yaxis: { title: { text: "step time, ms" } },
      xaxis: { type: "category" }
    });
    renderRankSplit(root, x);
    var slowest = 0;
    meas.forEach(function (m, i) {
      if (m !== null && m > meas[slowest]) {
        slowest = i;
      }
    });
    var fastest = 0;
    meas.forEach(function (m, i) {
      if (m !== null && m < meas[fastest]) {
        fastest = i;
      }
    });
    var late = DATA.summary.stragglers || [];
    caption(root, RANKS.length + " ranks. Longest step: rank " + RANKS[slowest].rank + " (" +
      ms(meas[slowest]) + " ms), shortest: rank " + RANKS[fastest].rank + " (" +
      ms(meas[fastest]) + " ms). " + (late.length
        ? "Stragglers, the ranks that arrive latest at collectives on average and made others " +
          "wait (the analyses below list the latest on average): " + late.join(", ") +
          " (a waiting rank shows the longest step, not the rank it waits for)."
        : "No rank arrived late at collectives often enough to call it a straggler."));
  }

  // ---- go --------------------------------------------------------------------------------

  var parts = [
    ["verdict", renderVerdict], ["summary", renderSummary], ["breakdown", renderBreakdown], ["timeline", renderTimeline],
    ["top", renderTop], ["critical-path", renderCritical], ["advice", renderAdvice],
    ["ranks", renderRanks]
  ];
  parts.forEach(function (p) {
    try {
      p[1]();
    } catch (e) {
      console.error("section " + p[0] + ": " + (e && e.stack ? e.stack : e));
      var b = document.getElementById(p[0] + "-body");
      if (b) {
        b.textContent = "";
        add(b, el("p", { "class": "note" }, "This section failed to render: " + e));
      }
    }
  });
  document.body.setAttribute("data-perfcast-rendered", "1");
})();

// ---- calling context: icicle (flame) graph of `perfcast tree` --------------------------
// Its own closure so the sections above stay as they are. One rectangle per call path,
// drawn on a canvas; only paths at least half a pixel wide are laid out, so a tree of
// tens of thousands of paths redraws in milliseconds. Names reach the page through
// canvas text and textContent only.
(function () {
  "use strict";

  var ROW = 18;
  var KIND_COLORS = {
    "root": "#9aa5b1", "rank": "#9aa5b1", "frame": "#e8a33d", "module": "#3aa39a",
    "annotation": "#7fb3d5", "op": "#5fa35f", "runtime": "#e6c84f", "kernel": "#8e6bbf",
    "copy": "#b07cc6", "special": "#d9534f"
  };

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var k in attrs || {}) {
      if (Object.prototype.hasOwnProperty.call(attrs, k)) {
        node.setAttribute(k, attrs[k]);
      }
    }
    if (text !== undefined && text !== null) {
      node.textContent = String(text);
    }
    return node;
  }

  function fmtMs(ns) {
    return (ns / 1e6).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 }) + " ms";
  }

  function renderContext(C) {
    var root = document.getElementById("context-body");
    if (!root) {
      return;
    }
    root.textContent = "";
    if (!C) {
      root.appendChild(el("p", { "class": "empty" }, "No calling context: the trace holds no events."));
      return;
    }
    var n = C.parent.length;
    var kids = [];
    var i;
    for (i = 0; i < n; i++) {
      kids.push([]);
    }
    for (i = 1; i < n; i++) {
      kids[C.parent[i]].push(i);
    }
    var state = { metric: C.gpu_total_ns > 0 ? "gpu" : "cpu", zoom: 0, match: null };
    var sorted = {};

    function childrenOf(node) {
      var key = state.metric;
      if (!sorted[key]) {
        var v = C[key];
        sorted[key] = kids.map(function (list) {
          return list.slice().sort(function (a, b) { return v[b] - v[a]; });
        });
      }
      return sorted[key][node];
    }

    var head = root.appendChild(el("p", { "class": "caption" },
      "Context from " + C.level_text + ". One box per call path, as wide as its time " +
      "(summed over " + C.steps + " step(s)); click to zoom, search to highlight. " +
      C.library_frames_hidden.toLocaleString("en-US") + " call-path nodes of PyTorch and " +
      "interpreter frames are hidden (perfcast tree --all-frames shows them; it folds " +
      "repeated module instances first, so it counts fewer)."));
    head.id = "flame-caption";
    (C.notes || []).slice(1).forEach(function (note) {  // the first repeats the level
      root.appendChild(el("p", { "class": "caption" }, note));
    });
    if (C.coverage_text) {  // as `perfcast tree` says it
      root.appendChild(el("p", { "class": "caption" }, C.coverage_text +
        (C.no_launch_pct > 0 ? " (" + C.no_launch_pct.toFixed(2) + "% of the GPU time has no " +
          "launching call in the trace)" : "") + "."));
    }
    var bar = root.appendChild(el("div", { "class": "flame-controls" }));
    var metric = bar.appendChild(el("select", { id: "flame-metric", "aria-label": "metric" }));
    [["gpu", "GPU time"], ["cpu", "CPU time"]].forEach(function (m) {
      var o = metric.appendChild(el("option", { value: m[0] }, m[1]));
      if (m[0] === state.metric) {
        o.selected = true;
      }
    });
    var search = bar.appendChild(el("input", {
      id: "flame-search", type: "search", placeholder: "search frames, modules, ops, kernels",
      "aria-label": "search", size: "40"
    }));
    var reset = bar.appendChild(el("button", { id: "flame-reset", type: "button" }, "reset zoom"));
    var summary = bar.appendChild(el("span", { id: "flame-match-summary", "class": "caption" }));
    var crumbs = root.appendChild(el("p", { id: "flame-zoom", "class": "caption" }));
    var wrap = root.appendChild(el("div", { "class": "flame-wrap" }));
    var canvas = wrap.appendChild(el("canvas", {
      id: "flame-canvas", role: "img",
      "aria-label": "icicle graph of the calling context: one box per call path, as wide " +
        "as its time; the matching paths are listed below"
    }));
    var tip = wrap.appendChild(el("div", { id: "flame-tip", "class": "flame-tip" }));
    tip.hidden = true;
    var matches = root.appendChild(el("ul", { id: "flame-matches", "class": "flame-matches" }));
    var rects = [];  // per row: [x, w, node] triples, in x order

    function matchesNode(node) {
      return state.match !== null && state.match[C.name[node]];
    }

    function ancestors(node) {
      var out = [];
      while (node > 0) {
        node = C.parent[node];
        out.unshift(node);
      }
      return out;
    }

    function color(node, dim) {
      var c = KIND_COLORS[C.kinds[C.kind[node]]] || "#999";
      if (state.match !== null) {
        return matchesNode(node) ? "#e0457b" : "#dcdfe3";
      }
      return dim ? "#cfd6dd" : c;
    }

    function draw() {
      var v = C[state.metric];
      var width = Math.max(wrap.clientWidth || 1200, 400);
      var up = ancestors(state.zoom);
      var total = v[state.zoom];
      var scale = total > 0 ? width / total : 0;
      var boxes = [];
      var maxRow = up.length;
      up.forEach(function (a, r) {
        boxes.push([0, width, a, r, true]);
      });
      var stack = [[state.zoom, 0, up.length]];
      while (stack.length) {
        var top = stack.pop();
        var node = top[0], x = top[1], row = top[2];
        var w = v[node] * scale;
        if (w < 0.5) {
          continue;
        }
        boxes.push([x, w, node, row, false]);
        if (row > maxRow) {
          maxRow = row;
        }
        var cx = x;
        var ch = childrenOf(node);
        var next = [];
        for (var k = 0; k < ch.length; k++) {
          var cw = v[ch[k]] * scale;
          if (cw < 0.5) {
            break;  // sorted: the rest are narrower still
          }
          next.push([ch[k], cx, row + 1]);
          cx += cw;
        }
        for (k = next.length - 1; k >= 0; k--) {
          stack.push(next[k]);
        }
      }
      canvas.width = width;
      canvas.height = (maxRow + 1) * ROW;
      canvas.style.width = width + "px";
      canvas.style.height = canvas.height + "px";
      var ctx = canvas.getContext("2d");
      ctx.clearRect(0, 0, canvas.width, canvas.height);
      ctx.font = "11px system-ui, sans-serif";
      ctx.textBaseline = "middle";
      rects = [];
      boxes.forEach(function (b) {
        var x = b[0], w = b[1], node = b[2], row = b[3];
        ctx.fillStyle = color(node, b[4]);
        ctx.fillRect(x, row * ROW, Math.max(w - 0.5, 0.5), ROW - 1);
        if (w > 28) {
          var label = C.names[C.name[node]];
          var chars = Math.floor((w - 6) / 6.2);
          ctx.fillStyle = "#111";
          ctx.fillText(label.length > chars ? label.slice(0, Math.max(chars - 1, 1)) + "…" : label,
            x + 3, row * ROW + ROW / 2);
        }
        (rects[row] = rects[row] || []).push([x, w, node]);
      });
      canvas.setAttribute("data-boxes", String(boxes.length));
      crumbs.textContent = state.zoom === 0 ? "showing everything" :
        "zoomed into " + C.names[C.name[state.zoom]] + " (" + fmtMs(C[state.metric][state.zoom]) +
        "); click a bar above it or reset to zoom out";
    }

    function at(evt) {
      var box = canvas.getBoundingClientRect();
      var x = evt.clientX - box.left, y = evt.clientY - box.top;
      var row = rects[Math.floor(y / ROW)] || [];
      for (var k = 0; k < row.length; k++) {
        if (x >= row[k][0] && x < row[k][0] + row[k][1]) {
          return { node: row[k][2], x: x, y: y };
        }
      }
      return null;
    }

    function showTip(hit) {
      if (!hit) {
        tip.hidden = true;
        return;
      }
      var node = hit.node;
      var v = C[state.metric];
      var total = v[0] || 1;
      tip.textContent = "";
      tip.appendChild(el("b", null, C.names[C.name[node]]));
      [
        C.kinds[C.kind[node]],
        "GPU " + fmtMs(C.gpu[node]) + " (self " + fmtMs(C.gpu_self[node]) + ")",
        "CPU " + fmtMs(C.cpu[node]) + " (self " + fmtMs(C.cpu_self[node]) + ")",
        (100 * v[node] / total).toFixed(2) + "% of all " + (state.metric === "gpu" ? "GPU" : "CPU") +
          " time",
        C.calls[node].toLocaleString("en-US") + " calls · " +
          C.launches[node].toLocaleString("en-US") + " launches · " +
          C.kernels[node].toLocaleString("en-US") + " kernels"
      ].forEach(function (line) {
        tip.appendChild(el("div", null, line));
      });
      tip.hidden = false;
      tip.style.left = Math.min(hit.x + 12, Math.max(canvas.width - 360, 0)) + "px";
      tip.style.top = (hit.y + 14) + "px";
    }

    function runSearch() {
      var q = search.value.trim().toLowerCase();
      matches.textContent = "";
      if (!q) {
        state.match = null;
        summary.textContent = "";
        draw();
        return;
      }
      state.match = C.names.map(function (s) { return s.toLowerCase().indexOf(q) >= 0; });
      var v = C[state.metric];
      var hits = [];
      var covered = 0;
      // Depth first from the root: a match inside a match counts once in the total.
      var stack = [[0, false]];
      while (stack.length) {
        var top = stack.pop();
        var node = top[0], inside = top[1];
        var m = node > 0 && state.match[C.name[node]];
        if (m) {
          hits.push(node);
          if (!inside) {
            covered += v[node];
          }
        }
        var ch = kids[node];
        for (var k = 0; k < ch.length; k++) {
          stack.push([ch[k], inside || m]);
        }
      }
      hits.sort(function (a, b) { return v[b] - v[a]; });
      summary.textContent = hits.length.toLocaleString("en-US") + " matching paths, " +
        fmtMs(covered) + " (" + (v[0] > 0 ? (100 * covered / v[0]).toFixed(1) : "0") + "%)";
      hits.slice(0, 10).forEach(function (node) {
        var li = matches.appendChild(el("li", { "data-node": String(node) }));
        li.appendChild(el("span", { "class": "flame-hit" }, C.names[C.name[node]]));
        li.appendChild(document.createTextNode(" · " + fmtMs(v[node])));
        li.addEventListener("click", function () {
          state.zoom = node;
          draw();
        });
      });
      draw();
    }

    metric.addEventListener("change", function () {
      state.metric = metric.value;
      runSearch();
    });
    search.addEventListener("input", runSearch);
    reset.addEventListener("click", function () {
      state.zoom = 0;
      draw();
    });
    canvas.addEventListener("mousemove", function (evt) { showTip(at(evt)); });
    canvas.addEventListener("mouseleave", function () { tip.hidden = true; });
    canvas.addEventListener("click", function (evt) {
      var hit = at(evt);
      if (hit) {
        state.zoom = hit.node;
        draw();
      }
    });
    draw();
  }

  try {
    renderContext(JSON.parse(document.getElementById("perfcast-data").textContent).context);
  } catch (e) {
    console.error("section context: " + (e && e.stack ? e.stack : e));
    var b = document.getElementById("context-body");
    if (b) {
      b.textContent = "This section failed to render: " + e;
    }
  }
})();
