"""The gateway's route table: the fixed endpoints, and one route per catalog operation
compiled from its ``google.api.http`` rule.

Path variables match one segment without ``:`` so ``/plans/{plan_id}`` and
``/plans/{plan_id}:apply`` never shadow each other; matching runs on the raw path and
decodes each variable, so ``%2F`` and ``%3A`` reach the field as ``/`` and ``:``.

Every major of the catalog has its routes under its own prefix, and its own envelope
endpoint (``POST /api/v1/acp``, ``POST /api/v2/acp``), which calls that major's operations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from starlette.types import Scope

from cleveragents.acp.contract import catalog, versions
from cleveragents.acp.contract.catalog import Catalog, Major, Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.contract.versions import VersionTable

ENVELOPE_PATH = "/api/v1/acp"
ENVELOPE_SUFFIX = "/acp"
HEALTH_PATH = "/healthz"
OPENAPI_PATH = "/api/v1/openapi.json"

VARIABLE = re.compile(r"\{([a-z_][a-z0-9_.]*)(?:=[^}]*)?\}")


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    pattern: re.Pattern[str]
    # Regex group name -> request field path.
    variables: Mapping[str, str]
    # The operation served, or the name of a fixed endpoint.
    op: Operation | None = None
    endpoint: str = ""
    # The major an envelope endpoint calls.
    major: Major | None = None
    # The versions that label the answer: those of the operation's or the endpoint's major.
    version_table: VersionTable = versions.V1


def compile_template(template: str) -> tuple[re.Pattern[str], dict[str, str]]:
    regex, variables, position = "^", {}, 0
    for index, match in enumerate(VARIABLE.finditer(template)):
        group = f"v{index}"
        variables[group] = match.group(1)
        regex += re.escape(template[position : match.start()]) + f"(?P<{group}>[^/:]+)"
        position = match.end()
    return re.compile(regex + re.escape(template[position:]) + "$"), variables


def _route(
    method: str,
    template: str,
    *,
    op: Operation | None = None,
    endpoint: str = "",
    major: Major | None = None,
) -> Route:
    pattern, variables = compile_template(template)
    table = op.version_table if op is not None else major.version_table if major is not None else versions.V1
    return Route(method, template, pattern, variables, op, endpoint, major, table)


def _prefix(path: str) -> str:
    """The first three segments of a path, the last cut at ``:`` (``/api/v1/plans`` of
    ``/api/v1/plans/x:apply``): a template's whole prefix is literal text in practice, so
    only routes of the same prefix can match a path."""
    head = path.split("/", 4)[:4]
    head[-1] = head[-1].split(":", 1)[0]
    return "/".join(head)


def _key(path: str) -> tuple[str, int]:
    return _prefix(path), path.count("/")


def _slashes(route: Route) -> int:
    return route.template.count("/")


class RouteTable:
    def __init__(
        self, operations: Iterable[Operation] | None = None, *, contract: Catalog | None = None
    ) -> None:
        """The routes of ``contract``'s majors (default: the product catalog), or of only
        ``operations`` (then the envelope endpoint calls the default major)."""
        contract = contract or catalog.CATALOG
        ops = contract.operations() if operations is None else operations
        self.routes: list[Route] = [
            *(
                _route("POST", major.prefix + ENVELOPE_SUFFIX, endpoint="envelope", major=major)
                for major in contract.majors.values()
            ),
            _route("GET", HEALTH_PATH, endpoint="health"),
            *(_route(op.http.method, op.http.path, op=op) for op in ops),
        ]
        # Candidates per (prefix, number of slashes), in table order: a variable matches one
        # segment, so a template only matches paths with as many slashes as it has. A
        # template with a variable in its prefix is a candidate for every prefix.
        anywhere = [route for route in self.routes if "{" in _prefix(route.template)]
        self._by_key: dict[tuple[str, int], list[Route]] = {}
        for route in self.routes:
            key = _key(route.template)
            if "{" not in key[0] and key not in self._by_key:
                self._by_key[key] = [
                    r
                    for r in self.routes
                    if _key(r.template) == key or (r in anywhere and _slashes(r) == key[1])
                ]
        self._anywhere: dict[int, list[Route]] = {}
        for route in anywhere:
            self._anywhere.setdefault(_slashes(route), []).append(route)

    def find(self, method: str, raw_path: str) -> tuple[Route, dict[str, str]] | None:
        """The route and its decoded path variables; None when no route has this path,
        NOT_FOUND naming the allowed methods when routes have it but not this verb.

        HEAD is served as GET (the server sends no body)."""
        verb = "GET" if method == "HEAD" else method
        allowed: list[str] = []
        key = _key(raw_path)
        candidates = self._by_key.get(key)
        if candidates is None:
            candidates = self._anywhere.get(key[1], [])
        for route in candidates:
            found = route.pattern.match(raw_path)
            if found is None:
                continue
            if route.method != verb:
                allowed.append(route.method)
                continue
            values = {route.variables[group]: unquote(value) for group, value in found.groupdict().items()}
            return route, values
        if allowed:
            path = unquote(raw_path)
            raise ACPError(
                ErrorCode.NOT_FOUND,
                f"{method} is not served on {path}; use {', '.join(sorted(allowed))}",
                {"path": path, "method": method, "allowed_methods": sorted(allowed)},
            )
        return None

    def match(self, method: str, raw_path: str) -> tuple[Route, dict[str, str]]:
        """As ``find``, with NOT_FOUND for an unknown path too."""
        found = self.find(method, raw_path)
        if found is None:
            raise not_found(unquote(raw_path))
        return found


def not_found(path: str) -> ACPError:
    return ACPError(ErrorCode.NOT_FOUND, f"no ACP endpoint at {path}", {"path": path})


def route_path(scope: Scope) -> str:
    """The raw (still percent-encoded) path below the application's mount point: the
    ``root_path`` a mounting application or proxy set is cut off."""
    raw = scope.get("raw_path")
    path: str = raw.decode("latin-1") if isinstance(raw, bytes) and raw else scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :] or "/"
    return path
