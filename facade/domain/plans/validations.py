"""Validations over a plan's artifacts after execute: ``regex``, ``json_schema``, ``command``.

Each yields pass/fail and messages naming the file (and line) at fault; a failed one
fails the execute phase with those messages.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import tempfile
from collections.abc import Sequence

from google.protobuf import json_format

from cleveragents.acp.facade.domain.access.policy import HOW_TO_ALLOW_COMMANDS, Policy
from cleveragents.acp.facade.domain.bounded import caller_work, globs, patterns
from cleveragents.acp.facade.domain.plans import process
from cleveragents.acp.facade.domain.plans.staging import StagedArtifact, Staging
from cleveragents.acp.v1 import events_pb2, specs_pb2

# Output lines of a failed command validation kept in its messages.
_TAIL_LINES = 20


def _regex(check: specs_pb2.RegexCheck, artifacts: Sequence[StagedArtifact]) -> list[str]:
    try:
        pattern = patterns.compiled(check.pattern, patterns.Dialect.RE2, multiline=True)
    except patterns.PatternError as exc:
        return [f"pattern {check.pattern!r} cannot be used: {exc}"]
    messages: list[str] = []
    for artifact in artifacts:
        assert artifact.content is not None
        text = artifact.content.decode("utf-8", errors="replace")
        match = pattern.search(text)
        if check.must_match and match is None:
            messages.append(f"{artifact.path}: pattern {check.pattern!r} not found")
        elif not check.must_match and match is not None:
            line = text.count("\n", 0, match.start()) + 1
            messages.append(f"{artifact.path}:{line}: matches pattern {check.pattern!r}")
    return messages


def _json_schema(check: specs_pb2.JsonSchemaCheck, artifacts: Sequence[StagedArtifact]) -> list[str]:
    schema = json_format.MessageToDict(check.schema)
    # Imported when a schema is checked: jsonschema is a tenth of a facade's import, and
    # most processes that open one (each local-mode ``agents`` command) never validate.
    from cleveragents.acp.facade.domain.bounded import json_schemas

    try:
        validator_class = json_schemas.check(schema)
    except json_schemas.SchemaError as exc:
        return [f"the schema is not valid: {exc.message}"]
    messages: list[str] = []
    for artifact in artifacts:
        assert artifact.content is not None
        try:
            document = json.loads(artifact.content)
        except ValueError as exc:
            messages.append(f"{artifact.path}: not JSON ({exc})")
            continue
        problems = json_schemas.errors(validator_class, schema, document)
        messages.extend(f"{artifact.path}: {problem}" for problem in problems)
    return messages


def _materialize_all(staging: Staging, folder: pathlib.Path) -> None:
    roots = list(staging.resources.values())
    for root in roots:
        process.materialize(staging, root, folder if len(roots) == 1 else folder / root.name)


async def _command(
    check: specs_pb2.CommandCheck, staging: Staging, cancel: asyncio.Event, policy: Policy
) -> list[str]:
    """Exit 0 in a scratch copy of the staged project: the resource's folder when the
    project has one resource, else a folder holding one folder per resource."""
    argv = list(check.argv)
    with tempfile.TemporaryDirectory(prefix="acp-validate-") as scratch:
        folder = pathlib.Path(scratch)
        await asyncio.to_thread(_materialize_all, staging, folder)
        try:
            outcome = await process.run(
                argv,
                folder,
                seconds=check.timeout_seconds or process.DEFAULT_TIMEOUT_SECONDS,
                output_limit=process.DEFAULT_OUTPUT_LIMIT,
                cancel=cancel,
                policy=policy,
            )
        except OSError as exc:
            return [f"cannot run {argv[0]!r}: {exc.strerror or exc}"]
    if outcome.ok:
        return []
    if outcome.cancelled:
        return ["interrupted by cancel"]
    if outcome.timed_out:
        return [f"{' '.join(argv)} ran longer than its timeout"]
    output = (outcome.stdout + outcome.stderr).strip().splitlines()[-_TAIL_LINES:]
    return [f"{' '.join(argv)} exited with {outcome.exit_code}", *output]


def refused(
    name: str, spec: specs_pb2.ValidationSpec, policy: Policy, profile: specs_pb2.AutomationProfileSpec
) -> events_pb2.ValidationCompleted | None:
    """A command validation runs a process: only when the operator enabled commands and
    the plan's automation profile lists it in ``allowed_validations``; otherwise it
    fails, saying why, without running."""
    if spec.WhichOneof("check") != "command":
        return None
    if not policy.allow_commands:
        reason = f"a command validation; this server runs no commands ({HOW_TO_ALLOW_COMMANDS})"
    elif name not in profile.allowed_validations:
        reason = "a command validation runs only when the automation profile lists it in allowed_validations"
    else:
        return None
    return events_pb2.ValidationCompleted(validation=name, passed=False, messages=[f"not run: {reason}"])


async def run(
    namespace: str,
    name: str,
    spec: specs_pb2.ValidationSpec,
    staging: Staging,
    artifacts: Sequence[StagedArtifact],
    cancel: asyncio.Event,
    policy: Policy,
) -> events_pb2.ValidationCompleted:
    checked = [a for a in artifacts if a.content is not None and globs.matches_any(a.path, list(spec.paths))]
    check = spec.WhichOneof("check")
    # Off the event loop, on the caller-work pool: RE2 and the schemas are linear in the
    # artifacts' size (the schemas bounded too), but the artifacts may be large.
    if check == "regex":
        messages = await caller_work.CALLER_WORK.run(namespace, _regex, spec.regex, checked)
    elif check == "json_schema":
        messages = await caller_work.CALLER_WORK.run(namespace, _json_schema, spec.json_schema, checked)
    elif check == "command":
        messages = await _command(spec.command, staging, cancel, policy)
    else:
        messages = ["the validation names no check"]
    return events_pb2.ValidationCompleted(validation=name, passed=not messages, messages=messages)
