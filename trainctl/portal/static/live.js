// The job page and the jobs list, live (no build step, no third-party code): server-sent events
// from /api/trainjob/<job>/state/stream, /api/trainjobs/stream and /api/trainjob/<job>/logs/stream.
// Everything a job says is set as text (textContent), never as HTML.
(function () {
  "use strict";

  function byId(id) { return document.getElementById(id); }
  function setText(id, value) { var el = byId(id); if (el) el.textContent = value === null || value === undefined || value === "" ? "-" : String(value); }
  function announce(message) { var el = byId("announce"); if (el) el.textContent = message; }
  function cell(row, value) { var td = document.createElement("td"); td.textContent = value === null || value === undefined ? "" : String(value); row.appendChild(td); return td; }
  function stateClass(state) { return "state state-" + String(state || "").toLowerCase().replace(/[^a-z]/g, ""); }
  function queueText(q, long) {
    if (!q) return "-";
    if (!long) return "#" + q.position + (q.estimated ? " (estimated)" : "");
    return "position " + q.position + (q.ahead.length ? ", behind " + q.ahead.join(", ") : "") + (q.estimated ? " (estimated: " + q.source + ")" : "");
  }
  function query(params) {
    return Object.keys(params).map(function (k) { return encodeURIComponent(k) + "=" + encodeURIComponent(params[k]); }).join("&");
  }

  // --- the job page -------------------------------------------------------------------------
  var page = byId("job");
  if (page) {
    var job = page.dataset.job, namespace = page.dataset.namespace, base = "/api/trainjob/" + encodeURIComponent(job);
    var pre = byId("log"), logSource = null, lastState = byId("state").textContent, lastProgress = null, chartAt = 0, chartTimer = null;

    var follow = function (worker) {
      if (logSource) logSource.close();
      pre.textContent = "";
      byId("worker").value = String(worker);
      logSource = new EventSource(base + "/logs/stream?" + query({ namespace: namespace, worker: worker }));
      logSource.addEventListener("line", function (e) { pre.appendChild(document.createTextNode(e.data + "\n")); pre.scrollTop = pre.scrollHeight; });
      logSource.addEventListener("status", function (e) { byId("log-status").textContent = JSON.parse(e.data).message; });
      logSource.addEventListener("end", function (e) {
        var end = JSON.parse(e.data);
        pre.appendChild(document.createTextNode("-- " + end.message + " --\n"));
        byId("log-status").textContent = "";
        logSource.close();
      });
    };

    var refreshChart = function () {
      chartAt = Date.now();
      fetch(base + "/progress?" + query({ namespace: namespace }), { credentials: "same-origin" }).then(function (r) { return r.ok ? r.json() : null; }).then(function (found) {
        if (!found) return;
        var some = found.points.length > 0;
        byId("chart-figure").hidden = !some;
        byId("chart-none").hidden = some;
        if (some) {
          var img = byId("chart");
          img.alt = found.summary;
          img.src = base + "/chart.svg?" + query({ namespace: namespace, n: found.points.length, at: chartAt });
        }
      });
    };
    var chartSoon = function () {  // at most every 5 s while the job reports
      if (chartTimer) return;
      chartTimer = setTimeout(function () { chartTimer = null; refreshChart(); }, Math.max(0, 5000 - (Date.now() - chartAt)));
    };

    var workers = function (list) {
      var body = byId("workers").tBodies[0];
      while (body.firstChild) body.removeChild(body.firstChild);
      if (!list.length) {
        var empty = document.createElement("tr");
        cell(empty, "No pods" + (page.dataset.finished === "true" ? " (gone: the job has finished)" : "") + ".").colSpan = 6;
        body.appendChild(empty);
      }
      list.forEach(function (w) {
        var tr = document.createElement("tr");
        cell(tr, w.worker); cell(tr, w.pod); cell(tr, w.phase); cell(tr, w.waiting || ""); cell(tr, w.restarts);
        var b = document.createElement("button");
        b.type = "button"; b.className = "log-button"; b.dataset.worker = String(w.worker); b.textContent = "Live log";
        b.addEventListener("click", function () { follow(w.worker); });
        cell(tr, "").appendChild(b);
        body.appendChild(tr);
      });
    };

    var ended = function () {
      page.dataset.finished = "true";
      var form = byId("cancel-form");
      if (form) form.parentNode.removeChild(form);
    };

    var state = new EventSource(base + "/state/stream?" + query({ namespace: namespace }));
    state.addEventListener("state", function (e) {
      var s = JSON.parse(e.data), el = byId("state");
      el.textContent = s.status;
      el.className = stateClass(s.status);
      byId("message").textContent = s.message || "";
      setText("nodes", s.nodes); setText("gpus", s.gpus); setText("progress", s.progress_text); setText("restarts", s.restarts);
      setText("started", s.started_at); setText("finished", s.completed_at); setText("queue", queueText(s.queue, true));
      workers(s.workers);
      if (!s.actions.cancel) ended();
      if (s.status !== lastState) announce("Job " + job + " is now " + s.status + (s.message ? ": " + s.message : "") + ".");
      lastState = s.status;
      if (s.progress_text !== lastProgress) { if (lastProgress !== null) chartSoon(); lastProgress = s.progress_text; }
    });
    state.addEventListener("end", function (e) {
      var end = JSON.parse(e.data);
      state.close();
      if (end.reason === "finished") { ended(); refreshChart(); }
      else if (end.reason === "gone") { ended(); announce("Job " + job + " is gone: " + end.message + "."); setText("state", "Deleted"); byId("state").className = stateClass("deleted"); }
      else { byId("message").textContent = end.message; }
    });

    byId("follow").addEventListener("click", function () { follow(byId("worker").value); });
    Array.prototype.forEach.call(document.querySelectorAll(".log-button"), function (b) {
      b.addEventListener("click", function () { follow(b.dataset.worker); });
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
    var jobs = new EventSource("/api/trainjobs/stream?" + query({ namespace: table.dataset.namespace }));
    jobs.addEventListener("jobs", function (e) {
      var body = table.tBodies[0], items = JSON.parse(e.data).items, changes = [];
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
        if (seen[j.trainjob_name] !== undefined && seen[j.trainjob_name] !== j.status) changes.push(j.trainjob_name + " is now " + j.status);
        seen[j.trainjob_name] = j.status;
      });
      if (!items.length) cell(body.appendChild(document.createElement("tr")), "No jobs left (cancelled or deleted).").colSpan = 6;
      if (changes.length) announce(changes.join("; ") + ".");
    });
    jobs.addEventListener("end", function () { jobs.close(); });
  }
})();
