// Swagger UI over the gateway's OpenAPI document (relative: the docs may be mounted anywhere).
window.ui = window.SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [window.SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
