// Draws the "Trace analyses" section from DATA.analyses (perfcast analyze's result).
// Own helpers, so report.js stays as it is; trace text only reaches the page via textContent.
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("perfcast-data").textContent);
  var A = DATA.analyses;
  var root = document.getElementById("analyses-body");
  if (!root) {
    return;
  }
  root.textContent = "";
  var SERIES = { series: 1, timeline: 1, bandwidth: 1, values: 1 };
  var ROWS = 15;

  function el(tag, cls, text) {
    var n = document.createElement(tag);
    if (cls) {
      n.setAttribute("class", cls);
    }
    if (text !== undefined && text !== null) {
      n.textContent = String(text);
    }
    return n;
  }

  function cell(v) {
    if (v === null || v === undefined) {
      return "-";
    }
    if (typeof v === "number") {
      var a = Math.abs(v);
      if (Number.isInteger(v)) {
        return v.toLocaleString("en-US");
      }
      // "232,070" beside "229,175": the same separators as the integers.
      return a >= 100 ? Math.round(v).toLocaleString("en-US") : a >= 1 ? v.toFixed(2) :
        a >= 0.001 || a === 0 ? v.toPrecision(3) : v > 0 ? "<0.001" : ">-0.001";
    }
    if (typeof v === "boolean") {
      return v ? "yes" : "";
    }
    var s = String(v).replace(/^void /, "");  // as the terminal shows kernel names
    return s.length > 120 ? s.slice(0, 119) + "…" : s;
  }

  // "mean_op_to_launch_us" -> "mean op to launch µs" (the tooltip keeps the field name).
  function heading(c) {
    return c.replace(/_/g, " ").replace(/\bus\b/g, "µs").replace(/\bgbs\b/g, "GB/s")
      .replace(/\bpct\b/g, "%").replace(/\bmb\b/g, "MB").replace(/\bms\b/g, "ms");
  }

  function rowsTable(parent, title, rows) {
    if (!rows || !rows.length) {
      return;
    }
    parent.appendChild(el("h4", null, title));
    var wrap = parent.appendChild(el("div", "scroll"));
    var t = wrap.appendChild(el("table", "data"));
    var cols = Object.keys(rows[0]);
    var tr = t.appendChild(el("thead")).appendChild(el("tr"));
    cols.forEach(function (c) {
      var th = tr.appendChild(el("th", typeof rows[0][c] === "number" ? "num" : null,
        heading(c)));
      th.title = c;  // the column's name in --json, --csv and the API
    });
    var tb = t.appendChild(el("tbody"));
    // A table with a row per rank shows the first ROWS rows of each of its first 16 ranks,
    // in the table's order (a cap over all rows let the first ranks fill it).
    var shown = rows;
    if (cols.indexOf("rank") >= 0) {
      var seen = {};
      var order = [];
      shown = rows.filter(function (r) {
        if (!(r.rank in seen)) {
          seen[r.rank] = 0;
          order.push(r.rank);
        }
        seen[r.rank] += 1;
        return order.indexOf(r.rank) < 16 && seen[r.rank] <= ROWS;
      });
    } else {
      shown = rows.slice(0, ROWS);
    }
    var limit = shown.length;
    // A column of long text (kernel, op and file names) in the narrow monospace style, with
    // the whole of a very long one as the tooltip; a column of short words ("computation",
    // "GPU 0") as plain text. Decided per column: per cell, "computation + communication"
    // came out in another font than the "communication + memory" under it.
    var nameCol = {};
    cols.forEach(function (c) {
      nameCol[c] = shown.some(function (r) {
        return typeof r[c] === "string" && r[c].length > 24;
      });
    });
    shown.forEach(function (r) {
      var row = tb.appendChild(el("tr"));
      cols.forEach(function (c) {
        var v = r[c];
        var long = typeof v === "string" && nameCol[c];
        var td = row.appendChild(el("td", typeof v === "number" ? "num" : long ? "name" : null,
          cell(v)));
        if (long && v.length > 120) {
          td.title = v;
        }
      });
    });
    if (rows.length > limit) {
      parent.appendChild(el("p", "caption", "… " + (rows.length - limit) +
        " more rows: `perfcast analyze --csv DIR` or the API have them all."));
    }
  }

  function lineChart(parent, id, groups, yTitle) {
    var traces = Object.keys(groups).map(function (k) {
      var g = groups[k];
      return { type: "scatter", mode: "lines", line: { shape: "hv" }, name: k, x: g.x, y: g.y };
    });
    if (!traces.length) {
      return;
    }
    var div = parent.appendChild(el("div", "chart"));
    div.id = id;
    Plotly.newPlot(div, traces, {
      height: 300, margin: { l: 60, r: 20, t: 20, b: 50 },
      xaxis: { title: { text: "ms from the rank's first event" } },
      yaxis: { title: { text: yTitle } }, legend: { orientation: "h", y: -0.3 }
    }, { displaylogo: false, responsive: true });
  }

  function grouped(rows, key, x, y) {
    var out = {};
    (rows || []).forEach(function (r) {
      var k = key(r);
      var g = out[k] || (out[k] = { x: [], y: [] });
      g.x.push(r[x]);
      g.y.push(r[y]);
    });
    return out;
  }

  if (!A) {
    root.appendChild(el("p", "empty", "The analyses were not run."));
    return;
  }
  var names = Object.keys(A.titles);
  names.forEach(function (name) {
    var res = A.results[name];
    if (!res) {
      return;
    }
    var det = root.appendChild(el("details"));
    det.open = name === "kernels" || name === "idle";
    det.appendChild(el("summary", null, name + ": " + A.titles[name]));
    if (name === "stragglers" && res.candidates && res.candidates.length) {
      det.appendChild(el("p", "headline", "Straggler candidates (latest on average): ranks " +
        res.candidates.join(", ") + " (" + res.matched + " collectives matched)."));
    }
    if (name === "queue") {
      lineChart(det, "chart-queue", grouped(res.series, function (r) {
        return "rank " + r.rank + " stream " + r.stream;
      }, "t_ms", "length"), "launches queued");
    }
    if (name === "memory") {
      lineChart(det, "chart-memory", grouped(res.timeline, function (r) {
        return "rank " + r.rank;
      }, "t_ms", "allocated_mb"), "MB allocated");
      lineChart(det, "chart-copy-bw", grouped(res.bandwidth, function (r) {
        return "rank " + r.rank + " " + r.kind;
      }, "t_ms", "gbs"), "copy GB/s");
    }
    Object.keys(res).forEach(function (k) {
      var v = res[k];
      // A comparison across ranks says nothing about one rank.
      var oneRank = k === "across_ranks" && v.every(function (r) { return r.ranks === 1; });
      if (Array.isArray(v) && v.length && typeof v[0] === "object" && !SERIES[k] && !oneRank) {
        rowsTable(det, name + " · " + k, v);
      }
    });
    (res.notes || []).forEach(function (n) {
      det.appendChild(el("p", "note", n));
    });
  });
})();
