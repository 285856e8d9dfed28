// The job page and the jobs list, live (no build step, no third-party code, no inline script: the
// CSP is default-src 'self'): server-sent events from /api/trainjob/<job>/state/stream,
// /api/trainjobs/stream and /api/trainjob/<job>/logs/stream. Everything a job says is set as text
// (textContent), never as HTML. The job page holds at most two streams (its state and one log) and
// closes them when the job ends or the page goes (pagehide); a broken stream is opened again with
// backoff, the page saying "updates paused, retrying".
(function () {
  "use strict";

  var LOG_KEEP = 5000;  // lines of #log kept (the newest)
  function byId(id) { return document.getElementById(id); }
  function setText(id, value) { var el = byId(id); if (el) el.textContent = value === null || value === undefined || value === "" ? "-" : String(value); }
  function announce(message) { var el = byId("announce"); if (el) el.textContent = message; }
  function shown(value) { return value === null || value === undefined ? "" : String(value); }
  function cell(row, value) { var td = document.createElement("td"); td.textContent = shown(value); row.appendChild(td); return td; }
  function put(td, value) { var text = shown(value); if (td.textContent !== text) td.textContent = text; }
  function stateClass(state) { return "state state-" + String(state || "").toLowerCase().replace(/[^a-z]/g, ""); }
  function queueText(q, long) {
    if (!q) return "-";
    if (!long) return "#" + q.position + (q.estimated ? " (estimated)" : "");
    return "position " + q.position + (q.ahead.length ? ", behind " + q.ahead.join(", ") : "") + (q.estimated ? " (estimated: " + q.source + ")" : "");
  }
  function query(params) {
    return Object.keys(params).map(function (k) { return encodeURIComponent(k) + "=" + encodeURIComponent(params[k]); }).join("&");
  }

  // A stream that is opened again after an error (the server's end with reason "error", a dropped
  // connection, an expired sign-in session), waiting 2, 4, 8 ... 60 s; `paused` says so on the page.
  function resilient(url, handlers, paused) {
    var source = null, timer = null, delay = 2000, stopped = false;
    var retry = function (why) {
      if (source) { source.close(); source = null; }
      if (stopped || timer) return;
      if (handlers.gone) {  // a stream refused at its start (HTTP 404: the job was deleted meanwhile) is not retried
        fetch(handlers.gone, { credentials: "same-origin" }).then(function (r) {
          if (r.status === 404 && !stopped) { stop(); handlers.end({ reason: "gone", message: "the job is gone (deleted)", status: null }); }
        }).catch(function () { return null; });
      }
      paused("updates paused (" + why + "), retrying in " + Math.round(delay / 1000) + " s");
      timer = setTimeout(function () { timer = null; open(); }, delay);
      delay = Math.min(delay * 2, 60000);
    };
    var open = function () {
      source = new EventSource(url);
      source.addEventListener("open", function () { if (handlers.open) handlers.open(); });
      Object.keys(handlers).forEach(function (kind) {
        if (kind === "open" || kind === "end" || kind === "gone") return;
        source.addEventListener(kind, function (e) { delay = 2000; paused(""); handlers[kind](kind === "line" ? e.data : JSON.parse(e.data)); });
      });
      source.addEventListener("end", function (e) {
        var end = JSON.parse(e.data);
        if (end.reason === "error") { retry(end.message); return; }
        stop();
        handlers.end(end);
      });
      source.onerror = function () { retry("the connection was lost"); };
    };
    var stop = function () { stopped = true; if (timer) clearTimeout(timer); timer = null; if (source) source.close(); source = null; };
    open();
    return { stop: stop };
  }
  function pausedIn(id) {  // says "updates paused" in element `id`, and takes back only that
    return function (message) {
      var el = byId(id);
      if (!el) return;
      if (message) { el.textContent = message; el.dataset.paused = "true"; }
      else if (el.dataset.paused === "true") { el.textContent = ""; el.dataset.paused = ""; }
    };
  }

  // --- the job page -------------------------------------------------------------------------
  var page = byId("job");
  if (page) {
    var job = page.dataset.job, namespace = page.dataset.namespace, base = "/api/trainjob/" + encodeURIComponent(job);
    var pre = byId("log"), logStream = null, logLines = 0, stateStream = null, lastState = byId("state").textContent, lastProgress = byId("progress").textContent;
    var chartBusy = false, chartAgain = false, closeTimer = null, scrollSoon = false;

    var clearLog = function () { pre.textContent = ""; logLines = 0; byId("log-note").hidden = true; };
    var addLine = function (text) {
      pre.appendChild(document.createTextNode(text + "\n"));
      logLines += 1;
      if (logLines > LOG_KEEP) {
        pre.removeChild(pre.firstChild);
        logLines -= 1;
        byId("log-note").hidden = false;
      }
      if (!scrollSoon) {  // once a frame: a layout per line would stall the page on a fast log
        scrollSoon = true;
        window.requestAnimationFrame(function () { scrollSoon = false; pre.scrollTop = pre.scrollHeight; });
      }
    };
    var follow = function (worker) {
      if (logStream) logStream.stop();
      clearLog();
      byId("worker").value = String(worker);
      // each (re)connection reads the log from its start: the lines are cleared when it opens, never doubled
      logStream = resilient(base + "/logs/stream?" + query({ namespace: namespace, worker: worker }), {
        open: clearLog,
        line: function (text) { addLine(text); },
        status: function (s) { byId("log-status").textContent = s.message; },
        end: function (end) { addLine("-- " + end.message + " --"); byId("log-status").textContent = ""; logStream = null; },
      }, pausedIn("log-status"));
    };

    // the chart: read again when the job's progress changes (one read at a time, never on a timer)
    var refreshChart = function () {
      if (chartBusy) { chartAgain = true; return; }
      chartBusy = true;
      fetch(base + "/progress?" + query({ namespace: namespace }), { credentials: "same-origin" }).then(function (r) { return r.ok ? r.json() : null; }).then(function (found) {
        if (!found) return;
        var some = found.points.length > 0;
        byId("chart-figure").hidden = !some;
        byId("chart-none").hidden = some;
        if (some) {
          var img = byId("chart");
          img.alt = found.summary;
          img.src = base + "/chart.svg?" + query({ namespace: namespace, n: found.points.length, last: found.points[found.points.length - 1].step });
        }
      }).catch(function () { return null; }).then(function () {
        chartBusy = false;
        if (chartAgain) { chartAgain = false; refreshChart(); }
      });
    };

    // the workers table, updated in place: a row per pod, its cells' text changed only where it
    // changed, its button kept (the keyboard focus stays where it was)
    var workers = function (list) {
      var body = byId("workers").tBodies[0], keep = {};
      list.forEach(function (w) { keep[w.pod] = true; });
      Array.prototype.slice.call(body.rows).forEach(function (tr) { if (!tr.dataset.pod || !keep[tr.dataset.pod]) body.removeChild(tr); });
      list.forEach(function (w, i) {
        var tr = Array.prototype.filter.call(body.rows, function (r) { return r.dataset.pod === w.pod; })[0];
        if (!tr) {
          tr = document.createElement("tr");
          tr.dataset.pod = w.pod;
          for (var c = 0; c < 5; c++) cell(tr, "");
          var b = document.createElement("button");
          b.type = "button"; b.className = "log-button"; b.textContent = "Live log";
          b.addEventListener("click", function () { follow(b.dataset.worker); });
          cell(tr, "").appendChild(b);
        }
        if (body.rows[i] !== tr) body.insertBefore(tr, body.rows[i] || null);
        put(tr.cells[0], w.worker); put(tr.cells[1], w.pod); put(tr.cells[2], w.phase); put(tr.cells[3], w.waiting || ""); put(tr.cells[4], w.restarts);
        tr.cells[5].firstChild.dataset.worker = shown(w.worker);
      });
      if (!list.length) {
        var empty = document.createElement("tr");
        cell(empty, "No pods" + (page.dataset.finished === "true" ? " (gone: the job has finished)" : "") + ".").colSpan = 6;
        body.appendChild(empty);
      }
    };

    // the job is deleted (by this page's Cancel: the API's answer says so; or elsewhere: its
    // stream found it gone): said as its state, every stream of it stopped
    var deleted = function (message) {
      ended();
      if (stateStream) stateStream.stop();
      stateStream = null;
      if (logStream) logStream.stop();
      logStream = null;
      announce("Job " + job + " is gone: " + message + ".");
      setText("state", "Deleted"); byId("state").className = stateClass("deleted"); byId("message").textContent = message;
    };

    var ended = function () {
      page.dataset.finished = "true";
      var form = byId("cancel-form");
      if (form) form.parentNode.removeChild(form);
      // the log stream ends by itself when the container does; it is closed all the same soon after
      if (logStream && !closeTimer) closeTimer = setTimeout(function () { if (logStream) logStream.stop(); logStream = null; }, 15000);
    };

    stateStream = resilient(base + "/state/stream?" + query({ namespace: namespace }), {
      gone: base + "/status?" + query({ namespace: namespace }),
      state: function (s) {
        var el = byId("state");
        el.textContent = s.status;
        el.className = stateClass(s.status);
        byId("message").textContent = s.message || "";
        setText("nodes", s.nodes); setText("gpus", s.gpus); setText("progress", s.progress_text); setText("restarts", s.restarts);
        setText("started", s.started_at); setText("finished", s.completed_at); setText("queue", queueText(s.queue, true));
        workers(s.workers);
        if (!s.actions.cancel) ended();
        if (s.status !== lastState) announce("Job " + job + " is now " + s.status + (s.message ? ": " + s.message : "") + ".");
        lastState = s.status;
        var progressText = s.progress_text === null || s.progress_text === undefined || s.progress_text === "" ? "-" : String(s.progress_text);
        if (progressText !== lastProgress) { lastProgress = progressText; refreshChart(); }
      },
      end: function (end) {
        stateStream = null;
        if (end.reason === "finished") { ended(); refreshChart(); }
        else if (end.reason === "gone") deleted(end.message);
      },
    }, pausedIn("live-status"));

    // Cancel: confirmed here (an inline handler would be refused by the CSP), sent as the API's
    // DELETE; the state stream then shows the job going (Deleted) with no reload. Without script
    // the form posts to /jobs/<job>/cancel as before.
    var cancelForm = byId("cancel-form");
    if (cancelForm) {
      cancelForm.addEventListener("submit", function (e) {
        e.preventDefault();
        if (!window.confirm("Cancel job " + job + "? It stops and is deleted.")) return;
        var button = byId("cancel"), token = cancelForm.querySelector("input[name=csrf]"), headers = {};
        if (token && token.value) headers["x-csrf-token"] = token.value;
        button.disabled = true;
        byId("cancel-status").textContent = "Cancelling...";
        fetch(base + "?" + query({ namespace: namespace }), { method: "DELETE", credentials: "same-origin", headers: headers }).then(function (r) {
          return r.json().catch(function () { return {}; }).then(function (body) {
            if (r.ok) { deleted("cancelled: the job and its pods are deleted"); return; }
            var why = body.detail || (body.problems ? body.problems.map(function (p) { return p.problem; }).join("; ") : "HTTP " + r.status);
            throw new Error(typeof why === "string" ? why : JSON.stringify(why));
          });
        }).catch(function (err) {
          button.disabled = false;
          byId("cancel-status").textContent = "Not cancelled: " + err.message;
        });
      });
    }

    byId("follow").addEventListener("click", function () { follow(byId("worker").value); });
    Array.prototype.forEach.call(document.querySelectorAll(".log-button"), function (b) {
      b.addEventListener("click", function () { follow(b.dataset.worker); });
    });
    window.addEventListener("pagehide", function () {
      if (stateStream) stateStream.stop();
      if (logStream) logStream.stop();
      stateStream = logStream = null;
    });
    follow(0);  // worker 0's log, followed from the start
  }

  // --- the jobs list ------------------------------------------------------------------------
  var table = byId("jobs");
  if (table && !page) {
    var age = function (created) {
      if (!created) return "-";
      var s = Math.max(0, Math.floor((Date.now() - Date.parse(created)) / 1000));
      if (isNaN(s)) return "-";
      var units = [["d", 86400], ["h", 3600], ["m", 60]];
      for (var i = 0; i < units.length; i++) if (s >= units[i][1]) return Math.floor(s / units[i][1]) + units[i][0];
      return s + "s";
    };
    var seen = {};
    Array.prototype.forEach.call(table.tBodies[0].rows, function (tr) { if (tr.dataset.job) seen[tr.dataset.job] = tr.cells[1].textContent; });
    var list = resilient("/api/trainjobs/stream?" + query({ namespace: table.dataset.namespace }), {
      jobs: function (found) {
        var body = table.tBodies[0], items = found.items, changes = [];
        while (body.firstChild) body.removeChild(body.firstChild);
        items.forEach(function (j) {
          var tr = document.createElement("tr"), a = document.createElement("a");
          tr.dataset.job = j.trainjob_name;
          a.href = "/jobs/" + encodeURIComponent(j.trainjob_name);
          a.textContent = j.trainjob_name;
          cell(tr, "").appendChild(a);
          cell(tr, j.status).className = stateClass(j.status);
          cell(tr, j.progress); cell(tr, queueText(j.queue, false)); cell(tr, j.gpus === null ? "-" : j.gpus); cell(tr, age(j.created_at));
          body.appendChild(tr);
          if (seen[j.trainjob_name] === undefined) changes.push(j.trainjob_name + " is new (" + j.status + ")");
          else if (seen[j.trainjob_name] !== j.status) changes.push(j.trainjob_name + " is now " + j.status);
          seen[j.trainjob_name] = j.status;
        });
        if (!items.length) cell(body.appendChild(document.createElement("tr")), "No jobs (none submitted yet, or all cancelled or deleted).").colSpan = 6;
        if (changes.length) announce(changes.join("; ") + ".");
      },
      end: function () { return null; },
    }, pausedIn("live-status"));
    window.addEventListener("pagehide", function () { list.stop(); });
  }
})();
