// /api/docs (trainctl/portal/apidocs.py): starts swagger-ui from the portal's own files. An external file, not an
// inline script: the page's Content-Security-Policy allows none. No validator badge (it would load another origin).
window.addEventListener("load", function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.openapi, dom_id: "#swagger-ui", deepLinking: true, validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout", showExtensions: true, showCommonExtensions: true,
  });
});
