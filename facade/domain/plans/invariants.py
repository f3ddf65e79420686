"""Invariants, checked before apply: each violation is listed, and any refuses the apply."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cleveragents.acp.facade.domain.bounded import globs, patterns
from cleveragents.acp.facade.domain.plans.staging import StagedArtifact
from cleveragents.acp.v1 import specs_pb2


def check(
    checks: Sequence[tuple[str, specs_pb2.InvariantSpec]], artifacts: Callable[[], list[StagedArtifact]]
) -> tuple[list[StagedArtifact], list[str]]:
    """The staged artifacts and every violation of ``checks``: file reads and regex matches,
    meant for a worker thread (RE2 matches without the GIL)."""
    staged = artifacts()
    return staged, [found for name, spec in checks for found in violations(name, spec, staged)]


def violations(name: str, spec: specs_pb2.InvariantSpec, artifacts: Sequence[StagedArtifact]) -> list[str]:
    rule = spec.WhichOneof("rule")
    found: list[str] = []
    if rule == "paths_within":
        allowed = list(spec.paths_within.globs)
        found = [
            f"{name}: {a.path} is outside {', '.join(allowed)}"
            for a in artifacts
            if not globs.matches_any(a.path, allowed)
        ]
    elif rule == "max_files_changed":
        limit = spec.max_files_changed.limit
        if len(artifacts) > limit:
            found = [f"{name}: {len(artifacts)} files changed, at most {limit} allowed"]
    elif rule == "forbid_regex":
        try:
            pattern = patterns.compiled(spec.forbid_regex.pattern, patterns.Dialect.RE2)
        except patterns.PatternError as exc:
            return [f"{name}: pattern {spec.forbid_regex.pattern!r} cannot be used: {exc}"]
        scope = list(spec.forbid_regex.paths)
        for artifact in artifacts:
            if artifact.content is None or not globs.matches_any(artifact.path, scope):
                continue
            text = artifact.content.decode("utf-8", errors="replace")
            match = pattern.search(text)
            if match is not None:
                line = text.count("\n", 0, match.start()) + 1
                forbidden = spec.forbid_regex.pattern
                found.append(f"{name}: {artifact.path}:{line} matches forbidden pattern {forbidden!r}")
    return found
