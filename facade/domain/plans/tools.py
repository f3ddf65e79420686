"""Tool invocation: the built-in ``fs.*`` tools over the staging area, and registered
``command`` tools run in a scratch copy of the staged view.

A tool returns its result and the file changes it staged; it never touches the project.
A failing call raises ``StepError`` with an error code and a message for the step.
"""

from __future__ import annotations

import asyncio
import pathlib
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.access.policy import Policy
from cleveragents.acp.facade.domain.plans import paths, process, templates
from cleveragents.acp.facade.domain.plans.records import Change
from cleveragents.acp.facade.domain.plans.staging import Staging
from cleveragents.acp.v1 import specs_pb2

_INVALID = "INVALID_PARAMS"


class StepError(Exception):
    def __init__(self, code: str, message: str, result: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.result = dict(result or {})

    @staticmethod
    def of(error: ACPError) -> StepError:
        return StepError(error.code, error.message)


@dataclass
class ToolResult:
    result: dict[str, Any]
    changes: list[Change] = field(default_factory=list)


def _text(args: Mapping[str, Any], name: str, *, required: bool = True) -> str:
    value = args.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise StepError(
            _INVALID,
            f"argument {name!r} must be a string" if value is not None else f"argument {name!r} is required",
        )
    return value


class _Call:
    """One built-in call: its arguments resolved against the staging area."""

    def __init__(self, staging: Staging, args: Mapping[str, Any], step_id: str) -> None:
        self.staging = staging
        self.args = args
        self.step_id = step_id

    def file(self, *, writing: bool) -> tuple[paths.ResourceRoot, str]:
        root, _, path = self.staging.locate(
            _text(self.args, "resource", required=False), _text(self.args, "path")
        )
        if writing and root.read_only:
            raise StepError(_INVALID, f"resource {root.name!r} is read-only")
        return root, path

    def existing(self, root: paths.ResourceRoot, path: str) -> bytes:
        content = self.staging.read(root, path)
        if content is None:
            raise StepError("NOT_FOUND", f"no file {path!r} in resource {root.name!r}")
        return content

    def change(self, root: paths.ResourceRoot, path: str, content: bytes | None) -> Change:
        return Change(self.step_id, root.name, path, content)


def _read(call: _Call) -> ToolResult:
    root, path = call.file(writing=False)
    content = call.existing(root, path)
    return ToolResult(
        {"path": path, "content": content.decode("utf-8", errors="replace"), "size": len(content)}
    )


def _list(call: _Call) -> ToolResult:
    root = call.staging.resource(_text(call.args, "resource", required=False))
    _, below = paths.resolve(root.root, _text(call.args, "path", required=False), allow_root=True)
    return ToolResult({"path": below, "paths": call.staging.files(root, below)})


def _write(call: _Call) -> ToolResult:
    root, path = call.file(writing=True)
    content = _text(call.args, "content").encode()
    return ToolResult({"path": path, "size": len(content)}, [call.change(root, path, content)])


def _replace(call: _Call) -> ToolResult:
    root, path = call.file(writing=True)
    old, new = _text(call.args, "old"), _text(call.args, "new")
    if not old:
        raise StepError(_INVALID, "argument 'old' must not be empty")
    try:
        text = call.existing(root, path).decode("utf-8")
    except UnicodeDecodeError:
        raise StepError(_INVALID, f"{path!r} is not UTF-8 text") from None
    count = text.count(old)
    if count != 1:
        raise StepError(
            _INVALID,
            f"fs.replace needs exactly one match of the text in {path!r}; found {count}",
            {"path": path, "matches": count},
        )
    content = text.replace(old, new, 1).encode()
    return ToolResult({"path": path, "size": len(content)}, [call.change(root, path, content)])


def _delete(call: _Call) -> ToolResult:
    root, path = call.file(writing=True)
    call.existing(root, path)
    return ToolResult({"path": path}, [call.change(root, path, None)])


BUILTIN: Mapping[str, Callable[[_Call], ToolResult]] = {
    "fs.read": _read,
    "fs.list": _list,
    "fs.write": _write,
    "fs.replace": _replace,
    "fs.delete": _delete,
}


def run_builtin(tool: str, staging: Staging, args: Mapping[str, Any], step_id: str) -> ToolResult:
    try:
        return BUILTIN[tool](_Call(staging, args, step_id))
    except ACPError as exc:
        raise StepError.of(exc) from None


def command_argv(spec: specs_pb2.ToolSpec, args: Mapping[str, Any]) -> list[str]:
    try:
        return [templates.as_text(templates.render(part, args)) for part in spec.argv]
    except templates.TemplateError as exc:
        raise StepError(_INVALID, str(exc)) from None


async def run_command(
    name: str,
    spec: specs_pb2.ToolSpec,
    staging: Staging,
    args: Mapping[str, Any],
    step_id: str,
    cancel: asyncio.Event,
    policy: Policy,
) -> ToolResult:
    """Run a command tool in a scratch copy of one resource's staged view; the files it
    changes there become the step's staged changes."""
    argv = command_argv(spec, args)
    if not argv:
        raise StepError(_INVALID, f"tool {name!r} has no argv")
    try:
        root = staging.resource(_text(args, "resource", required=False))
    except ACPError as exc:
        raise StepError.of(exc) from None
    with tempfile.TemporaryDirectory(prefix="acp-scratch-") as scratch:
        folder = pathlib.Path(scratch)
        before = await asyncio.to_thread(process.materialize, staging, root, folder)
        try:
            outcome = await process.run(
                argv,
                folder,
                seconds=spec.timeout_seconds or process.DEFAULT_TIMEOUT_SECONDS,
                output_limit=spec.output_limit_bytes or process.DEFAULT_OUTPUT_LIMIT,
                cancel=cancel,
                policy=policy,
            )
        except OSError as exc:
            raise StepError(_INVALID, f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
        changed = process.differences(before, await asyncio.to_thread(process.scan, folder))
    result: dict[str, Any] = {
        "argv": argv,
        "exit_code": outcome.exit_code,
        "stdout": outcome.stdout,
        "stderr": outcome.stderr,
        "truncated": outcome.truncated,
        "changed_paths": sorted(changed),
    }
    if outcome.cancelled:
        raise StepError("cancelled", f"tool {name!r} was interrupted by cancel", result)
    if outcome.timed_out:
        raise StepError("timeout", f"tool {name!r} ran longer than its timeout", result)
    if outcome.exit_code != 0:
        tail = outcome.stderr.strip().splitlines()[-1:] or [""]
        raise StepError(
            "command_failed", f"tool {name!r} exited with {outcome.exit_code}: {tail[0]}".rstrip(": "), result
        )
    if changed and root.read_only:
        raise StepError(
            _INVALID,
            f"tool {name!r} changed files of read-only resource {root.name!r}",
            result,
        )
    for path in changed:
        _check_produced(name, root, path, result)
    changes = [Change(step_id, root.name, path, content) for path, content in changed.items()]
    return ToolResult(result, changes)


def _check_produced(name: str, root: paths.ResourceRoot, path: str, result: Mapping[str, Any]) -> None:
    """A file a command made must have a name a built-in tool could have staged: no
    control characters or backslashes, bounded, not through a symlink out of the folder."""
    try:
        _, canonical = paths.resolve(root.root, path)
    except ACPError as exc:
        raise StepError(
            _INVALID, f"tool {name!r} made a file the project cannot hold: {exc.message}", result
        ) from None
    if canonical != path:
        raise StepError(
            _INVALID, f"tool {name!r} made {path!r}, which is {canonical!r} in the project", result
        )
