// Runs before anything else: every error the page hits ends up in <pre id="perfcast-errors">
// (shown when not empty), so a broken report says so and tests can read it from the DOM.
(function () {
  "use strict";
  var pending = [];

  function flush(pre) {
    while (pending.length) {
      pre.textContent += pending.shift() + "\n";
    }
    if (pre.textContent) {
      pre.hidden = false;
    }
  }

  function record(message) {
    pending.push(String(message));
    var pre = document.getElementById("perfcast-errors");
    if (pre) {
      flush(pre);
    }
  }

  window.__perfcastRecordError = record;

  window.addEventListener(
    "error",
    function (event) {
      var target = event.target;
      if (target && target !== window && target.tagName) {
        // A resource (image, script, style) failed to load: nothing here should load any.
        record("resource failed to load: <" + target.tagName.toLowerCase() + ">");
        return;
      }
      var where = event.filename ? " (" + event.filename + ":" + event.lineno + ")" : "";
      record("error: " + (event.message || "unknown") + where);
    },
    true
  );

  window.addEventListener("unhandledrejection", function (event) {
    var reason = event.reason;
    record("unhandled rejection: " + String((reason && (reason.stack || reason)) || "unknown"));
  });

  document.addEventListener("securitypolicyviolation", function (event) {
    record("blocked by Content-Security-Policy: " + event.violatedDirective +
      " " + (event.blockedURI || ""));
  });

  var originalError = console.error;
  console.error = function () {
    var parts = [];
    for (var i = 0; i < arguments.length; i++) {
      var a = arguments[i];
      parts.push(a && a.stack ? a.stack : String(a));
    }
    record("console.error: " + parts.join(" "));
    return originalError.apply(console, arguments);
  };

  document.addEventListener("DOMContentLoaded", function () {
    var pre = document.getElementById("perfcast-errors");
    if (pre) {
      flush(pre);
    }
  });
})();
