"""``project.resolve`` (ACP 1.3): the project whose directory resource contains a path, which
is what an editor opened on a folder asks first (``agents editor``'s ``session/new``).

Paths are compared as written, after folding ``.`` and ``..``: nothing on disk is read (the
path is the caller's, the folders the server's), so a symlinked checkout must be named by
the path its resource names. Of several containing resources the deepest wins; of several
projects naming it, the first by namespace and name.
"""

from __future__ import annotations

import posixpath
from typing import Any

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.registries.kinds import KINDS
from cleveragents.acp.facade.domain.registries.registry import Registries
from cleveragents.acp.v1 import registry_pb2, workspace_pb2

MAX_PATH = 4096


def checked_path(path: str) -> str:
    """The request's path, folded (``INVALID_PARAMS`` naming ``path`` when unusable)."""
    problem = None
    if not path:
        problem = "is required"
    elif len(path) > MAX_PATH:
        problem = f"is longer than {MAX_PATH} characters"
    elif "\x00" in path:
        problem = "contains a NUL character"
    elif not path.startswith("/"):
        problem = "must be absolute"
    if problem is not None:
        raise ACPError(ErrorCode.INVALID_PARAMS, f"path {problem}", {"field": "path"})
    return posixpath.normpath(path).replace("//", "/")


def _below(path: str, folder: str) -> str | None:
    """``path`` relative to ``folder`` ("" for the folder itself), or None when outside."""
    if path == folder:
        return ""
    prefix = folder if folder.endswith("/") else folder + "/"
    return path[len(prefix) :] if path.startswith(prefix) else None


class ProjectResolver:
    def __init__(self, registries: Registries) -> None:
        self.registries = registries

    async def resolve(
        self, ctx: CallContext, request: workspace_pb2.ResolveProjectRequest
    ) -> workspace_pb2.ResolveProjectResponse:
        path = checked_path(request.path)
        namespaces = ctx.visible_namespaces(request.namespace)
        return await self.registries.store.read(lambda _store: self._resolve(path, namespaces))

    def _resolve(self, path: str, namespaces: frozenset[str] | None) -> workspace_pb2.ResolveProjectResponse:
        store = self.registries.store
        scopes: list[str | None] = [None] if namespaces is None else [*sorted(namespaces)]
        # (namespace, resource) -> (depth, relative path), for every directory resource holding it.
        holding: dict[tuple[str, str], tuple[int, str]] = {}
        for scope in scopes:
            for record in store.iter_kind(KINDS["resource"].record_kind, scope):
                resource = registry_pb2.Resource.FromString(record.body)
                if not resource.spec.path or not self.registries.is_directory(
                    record.namespace, resource.spec
                ):
                    continue
                folder = posixpath.normpath(resource.spec.path)
                relative = _below(path, folder)
                if relative is not None:
                    holding[(record.namespace, resource.name)] = (folder.count("/"), relative)
        best: tuple[Any, ...] | None = None
        for scope in scopes:
            for record in store.iter_kind(KINDS["project"].record_kind, scope):
                project = registry_pb2.Project.FromString(record.body)
                for name in project.spec.resources:
                    found = holding.get((record.namespace, name))
                    if found is None:
                        continue
                    key = (-found[0], record.namespace, project.name)
                    if best is None or key < best[0]:
                        best = (key, project, name, found[1])
        if best is None:
            raise ACPError(
                ErrorCode.NOT_FOUND,
                f"no project has a directory resource containing {path}; register one: "
                f'agents resource add NAME --spec \'{{"type": "directory", "path": "{path}"}}\' '
                'then agents project add NAME --spec \'{"resources": ["NAME"]}\'',
                {"path": path},
                refinement="PROJECT_NOT_FOUND",
            )
        _, project, resource, relative = best
        return workspace_pb2.ResolveProjectResponse(
            project=project, resource=resource, relative_path=relative
        )
