"""Presentation: the JSON/HTTPS gateway (FastAPI) over the facade, REST routes and SSE."""
