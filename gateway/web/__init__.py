"""What the gateway serves to browsers: the web console at ``/`` and Swagger UI at
``/api/v1/docs``, as static files shipped in the package (no build step), under a strict
Content-Security-Policy."""
