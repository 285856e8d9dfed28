// The submit form (templates/submit.html; no build step). Without it the form works as plain HTML;
// with it: the error summary takes the focus, the code source and the resource and image choices
// enable only the fields they use (a disabled field is not sent), and choosing files selects "Upload".
(function () {
  var form = document.getElementById("submit-form");
  if (!form) return;
  var summary = document.getElementById("problems-summary");
  if (summary) {
    summary.focus();
    // a link of the summary puts the focus on its field, not only the view
    summary.addEventListener("click", function (e) {
      var a = e.target.closest ? e.target.closest("a[href^='#']") : null;
      var field = a ? document.getElementById(a.getAttribute("href").slice(1)) : null;
      if (field) {
        e.preventDefault();
        if (field.disabled) { var box = field.closest("fieldset:disabled"); if (box) box.disabled = false; }
        field.focus();
        field.scrollIntoView({ block: "center" });
      }
    });
  }
  function checked(name) {
    var c = form.querySelector("input[name=" + name + "]:checked");
    return c ? c.value : "";
  }
  function enable(id, on) {
    var el = document.getElementById(id);
    if (el) el.disabled = !on;
  }
  function update() {
    var upload = checked("code_source") === "upload";
    enable("paste-section", !upload);
    enable("upload-section", upload);
    enable("custom-resources", checked("preset") === "custom");
    enable("image", checked("image_choice") === "custom");
  }
  form.addEventListener("change", function (e) {
    if (e.target && e.target.id === "files" && e.target.files && e.target.files.length) {
      document.getElementById("code_source-upload").checked = true;
    }
    update();
  });
  update();
})();
