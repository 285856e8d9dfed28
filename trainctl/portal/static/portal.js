// The job page's live log: server-sent events from /api/trainjob/<job>/logs/stream (no build step).
(function () {
  var pre = document.getElementById("log");
  if (!pre) return;
  var source = null;
  function follow(worker) {
    if (source) source.close();
    pre.textContent = "";
    var url = "/api/trainjob/" + encodeURIComponent(pre.dataset.job) + "/logs/stream?namespace=" + encodeURIComponent(pre.dataset.namespace) + "&worker=" + encodeURIComponent(worker);
    source = new EventSource(url);
    source.addEventListener("line", function (e) { pre.textContent += e.data + "\n"; });  // text, never HTML
    source.addEventListener("status", function (e) { pre.dataset.status = JSON.parse(e.data).message; });
    source.addEventListener("end", function (e) { pre.textContent += "-- " + JSON.parse(e.data).message + " --\n"; source.close(); });
  }
  document.getElementById("follow").addEventListener("click", function () { follow(document.getElementById("worker").value); });
  Array.prototype.forEach.call(document.querySelectorAll(".log-button"), function (b) {
    b.addEventListener("click", function () { document.getElementById("worker").value = b.dataset.worker; follow(b.dataset.worker); });
  });
})();
