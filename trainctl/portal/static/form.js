// The submit form (templates/submit.html; no build step). Without it the form works as plain HTML;
// with it: the error summary takes the focus, the code source and the resource and image choices
// hide the fields they do not use, and choosing files selects "Upload". A hidden field is still
// posted (the server chooses by code_source, preset and image_choice), so a refused post keeps
// every value; only the file input is disabled with "Paste" (a page never keeps chosen files).
(function () {
  var form = document.getElementById("submit-form");
  if (!form) return;
  var summary = document.getElementById("problems-summary");
  if (summary) {
    summary.focus();
    // a link of the summary puts the focus on its field, not only the view (shown first if hidden)
    summary.addEventListener("click", function (e) {
      var a = e.target.closest ? e.target.closest("a[href^='#']") : null;
      var field = a ? document.getElementById(a.getAttribute("href").slice(1)) : null;
      if (field) {
        e.preventDefault();
        for (var box = field.closest("[hidden]"); box; box = field.closest("[hidden]")) box.hidden = false;
        var details = field.closest("details");
        if (details) details.open = true;
        field.focus();
        field.scrollIntoView({ block: "center" });
      }
    });
  }
  function checked(name) {
    var c = form.querySelector("input[name=" + name + "]:checked");
    return c ? c.value : "";
  }
  function show(id, on) {
    var el = document.getElementById(id);
    if (el) {
      el.hidden = !on;
      el.setAttribute("aria-hidden", on ? "false" : "true");
    }
  }
  function update() {
    var upload = checked("code_source") === "upload";
    show("paste-section", !upload);
    show("upload-section", upload);
    var files = document.getElementById("files");
    if (files) files.disabled = !upload;
    show("custom-resources", checked("preset") === "custom");
    show("image-field", checked("image_choice") === "custom");
  }
  form.addEventListener("change", function (e) {
    if (e.target && e.target.id === "files" && e.target.files && e.target.files.length) {
      document.getElementById("code_source-upload").checked = true;
    }
    update();
  });
  update();
})();
