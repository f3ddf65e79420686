"""The route table's prefix index answers exactly what a scan of every route in table
order answers: the same route, variables, allowed methods and errors."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.gateway.http.routing import VARIABLE, Route, RouteTable

TABLE = RouteTable()
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def scanned(method: str, raw_path: str) -> tuple[object, ...]:
    """The reference: every route in order, as the table did before it had an index."""
    verb = "GET" if method == "HEAD" else method
    allowed = []
    for route in TABLE.routes:
        found = route.pattern.match(raw_path)
        if found is None:
            continue
        if route.method != verb:
            allowed.append(route.method)
            continue
        return (
            "route",
            route.template,
            {route.variables[g]: unquote(v) for g, v in found.groupdict().items()},
        )
    return ("NOT_FOUND", sorted(allowed))


def indexed(method: str, raw_path: str) -> tuple[object, ...]:
    try:
        route, variables = TABLE.match(method, raw_path)
    except ACPError as err:
        return (err.code, err.details.get("allowed_methods", []))
    assert isinstance(route, Route)
    return ("route", route.template, variables)


def _paths() -> list[str]:
    paths = ["", "/", "/api", "/api/v1", "/api/v1/", "/nope", "/healthz/x", "/api/v1/acp/", "/api/v1/acp:x"]
    for route in TABLE.routes:
        for value in ("x", "a%2Fb", "01JB:C"):
            path = VARIABLE.sub(value, route.template)
            paths += [path, path + "/", path + ":bogus", path + "/extra", path.upper()]
    return sorted(set(paths))


@pytest.mark.parametrize("path", _paths())
def test_the_index_answers_as_a_scan_of_every_route(path: str) -> None:
    for method in METHODS:
        assert indexed(method, path) == scanned(method, path), (method, path)


def test_every_route_is_reached_by_its_own_paths() -> None:
    for route in TABLE.routes:
        found, _ = TABLE.match(route.method, VARIABLE.sub("v", route.template))
        assert found is route
