"""The staging area: the project's files overlaid with a plan's staged changes.

Tools read and write this view, never the project. What differs from the project's
current files is the plan's artifacts; a staged change that leaves a file as it is on
disk is no artifact at all.
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.plans import fsat, paths
from cleveragents.acp.facade.domain.plans.paths import ResourceRoot
from cleveragents.acp.facade.domain.plans.records import Change
from cleveragents.acp.v1 import plan_pb2


@dataclass(frozen=True)
class StagedArtifact:
    resource: str
    path: str
    op: plan_pb2.ArtifactOp.ValueType
    # The new content (None: the file is deleted) and what the project holds now.
    content: bytes | None
    current: bytes | None
    step_id: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest() if self.content is not None else ""

    def to_proto(self, *, include_content: bool = False) -> plan_pb2.Artifact:
        artifact = plan_pb2.Artifact(
            path=self.path,
            op=self.op,
            size=len(self.content or b""),
            sha256=self.sha256,
            step_id=self.step_id,
            resource=self.resource,
        )
        if include_content and self.content is not None:
            artifact.content = self.content.decode("utf-8", errors="replace")
        return artifact


def read_disk(root: ResourceRoot, path: str) -> bytes | None:
    """A file's bytes in the project, or None when it does not exist. ``path`` is
    canonical (no symlink on the way), so it is read from the operator's root without
    following any: a folder swapped for a symlink since it was resolved, above the
    resource or in it, reads as missing, never as outside."""
    try:
        with fsat.open_root(root.place) as root_fd:
            return fsat.read(root_fd, path).content
    except OSError:
        return None


class Staging:
    def __init__(self, resources: Mapping[str, ResourceRoot], changes: Iterable[Change] = ()) -> None:
        self.resources = dict(resources)
        self._staged: dict[tuple[str, str], Change] = {}
        for change in changes:
            self.record(change)

    def resource(self, name: str | None, *, field: str = "resource") -> ResourceRoot:
        """The named resource of the project; without a name, its only resource."""
        if name:
            root = self.resources.get(name)
            if root is None:
                raise ACPError(
                    ErrorCode.INVALID_PARAMS,
                    f"resource {name!r} is not one of the project's: {', '.join(self.resources)}",
                    {"field": field, "resource": name},
                )
            return root
        if len(self.resources) == 1:
            return next(iter(self.resources.values()))
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"the project has several resources ({', '.join(self.resources)}); name one with `resource`",
            {"field": field},
        )

    def locate(
        self, resource: str | None, path: str, *, allow_root: bool = False
    ) -> tuple[ResourceRoot, pathlib.Path, str]:
        root = self.resource(resource)
        target, canonical = paths.resolve(root.root, path, allow_root=allow_root)
        return root, target, canonical

    # the view ---------------------------------------------------------------------------

    def read(self, root: ResourceRoot, path: str) -> bytes | None:
        staged = self._staged.get((root.name, path))
        if staged is not None:
            return staged.content
        return read_disk(root, path)

    def files(self, root: ResourceRoot, below: str = "") -> list[str]:
        """Every file of the view under ``below`` (canonical relative paths), sorted."""
        found = set(paths.walk_files(root.root, below, anchor=root.place))
        prefix = f"{below}/" if below else ""
        for (resource, path), change in self._staged.items():
            if resource != root.name or not path.startswith(prefix):
                continue
            if change.content is None:
                found.discard(path)
            else:
                found.add(path)
        return sorted(found)

    def record(self, change: Change) -> None:
        self._staged[(change.resource, change.path)] = change

    # artifacts --------------------------------------------------------------------------

    def artifacts(self) -> list[StagedArtifact]:
        """What the plan changes against the project's current files, by resource and path."""
        found: list[StagedArtifact] = []
        for (resource, path), change in sorted(self._staged.items()):
            root = self.resources.get(resource)
            if root is None:
                continue
            current = read_disk(root, path)
            if change.content == current:
                continue
            if change.content is None:
                op = plan_pb2.ARTIFACT_OP_DELETE
            elif current is None:
                op = plan_pb2.ARTIFACT_OP_CREATE
            else:
                op = plan_pb2.ARTIFACT_OP_MODIFY
            found.append(StagedArtifact(resource, path, op, change.content, current, change.step_id))
        return found
