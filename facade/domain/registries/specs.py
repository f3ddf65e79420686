"""Spec validation per kind: every refusal is INVALID_PARAMS naming the field path
(``spec.steps[1].tool``). Validators also fill the documented defaults, so what is
stored (and shown) is what runs.

References to other entries are checked by ``Registries`` (see ``references``); the
checks here need at most the entries a spec names, through ``lookup``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format, message, struct_pb2

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.access import approval_rules
from cleveragents.acp.facade.domain.bounded import globs, patterns
from cleveragents.acp.v1 import specs_pb2

# (kind, name) -> the entry in the namespace being written, or None.
Lookup = Callable[[str, str], message.Message | None]

PROVIDERS = frozenset({"scripted", "openai", "orchestrator"})
DRIVERS = frozenset({"directory"})
DEFAULT_TIMEOUT_SECONDS = 30
MAX_TIMEOUT_SECONDS = 3600
DEFAULT_OUTPUT_LIMIT_BYTES = 65536
# Steps a plan may run when its automation profile sets no max_steps (or it has no profile),
# and the most a profile may allow: no plan runs unbounded.
DEFAULT_MAX_STEPS = 1000
MAX_MAX_STEPS = 100_000
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def invalid(field: str, message_: str, **details: Any) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, f"{field}: {message_}", {"field": field, **details})


def _non_negative(field: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise invalid(field, "must be a finite number >= 0")


def _timeout(field: str, value: int) -> int:
    """0 means the default; otherwise 1..3600 seconds."""
    if value == 0:
        return DEFAULT_TIMEOUT_SECONDS
    if not 1 <= value <= MAX_TIMEOUT_SECONDS:
        raise invalid(field, f"must be between 1 and {MAX_TIMEOUT_SECONDS} seconds")
    return value


def _argv(field: str, argv: Any) -> None:
    if not argv:
        raise invalid(field, "must name a program and its arguments")
    if not argv[0]:
        raise invalid(f"{field}[0]", "the program must not be empty")


def _regex(field: str, pattern: str, *, multiline: bool = False) -> None:
    """An RE2 pattern, compiled here as it will run (see ``patterns``)."""
    if not pattern:
        raise invalid(field, "must not be empty")
    try:
        patterns.compiled(pattern, patterns.Dialect.RE2, multiline=multiline)
    except patterns.PatternError as exc:
        raise invalid(field, f"cannot be used: {exc}") from None


def _globs(field: str, given: Sequence[str]) -> None:
    try:
        globs.check(given)
    except globs.GlobError as exc:
        raise invalid(field if exc.index is None else f"{field}[{exc.index}]", str(exc)) from None


def schema_of(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct as the plain JSON object a JSON Schema library reads."""
    return json_format.MessageToDict(struct)


def check_json_schema(field: str, struct: struct_pb2.Struct) -> None:
    """A valid JSON Schema whose every pattern RE2 can run (see ``json_schemas``)."""
    # Imported when a schema is checked (jsonschema: see plans.validations).
    from cleveragents.acp.facade.domain.bounded import json_schemas

    try:
        json_schemas.check(schema_of(struct))
    except json_schemas.SchemaError as exc:
        raise invalid(field, f"is not a valid JSON Schema: {exc.message}", schema_path=exc.where) from None


def _actor(spec: specs_pb2.ActorSpec, lookup: Lookup) -> None:
    if spec.provider not in PROVIDERS:
        raise invalid("spec.provider", f"must be one of {', '.join(sorted(PROVIDERS))}")
    if spec.provider == "openai":
        if not spec.model:
            raise invalid("spec.model", "the openai provider needs a model")
        if not spec.base_url:
            raise invalid("spec.base_url", "the openai provider needs a base URL")
    if spec.base_url:
        url = urlsplit(spec.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise invalid("spec.base_url", "must be an http or https URL")
    if spec.api_key_env and not _ENV_NAME.match(spec.api_key_env):
        raise invalid("spec.api_key_env", "must be the name of an environment variable, not a key")
    _non_negative("spec.cost_per_1k_tokens", spec.cost_per_1k_tokens)


def _skill(spec: specs_pb2.SkillSpec, lookup: Lookup) -> None:
    if not spec.instructions.strip():
        raise invalid("spec.instructions", "must not be empty")


def _tool(spec: specs_pb2.ToolSpec, lookup: Lookup) -> None:
    _argv("spec.argv", spec.argv)
    spec.timeout_seconds = _timeout("spec.timeout_seconds", spec.timeout_seconds)
    if spec.output_limit_bytes < 0:
        raise invalid("spec.output_limit_bytes", "must be >= 0")
    spec.output_limit_bytes = spec.output_limit_bytes or DEFAULT_OUTPUT_LIMIT_BYTES
    _non_negative("spec.cost", spec.cost)


def _validation(spec: specs_pb2.ValidationSpec, lookup: Lookup) -> None:
    _globs("spec.paths", spec.paths)
    check = spec.WhichOneof("check")
    if check is None:
        raise invalid("spec.check", "set exactly one of regex, json_schema, command")
    if check == "regex":
        _regex("spec.regex.pattern", spec.regex.pattern, multiline=True)
    elif check == "json_schema":
        check_json_schema("spec.json_schema.schema", spec.json_schema.schema)
    else:
        _argv("spec.command.argv", spec.command.argv)
        spec.command.timeout_seconds = _timeout("spec.command.timeout_seconds", spec.command.timeout_seconds)


def _resource_type(spec: specs_pb2.ResourceTypeSpec, lookup: Lookup) -> None:
    if spec.driver not in DRIVERS:
        raise invalid("spec.driver", f"must be one of {', '.join(sorted(DRIVERS))}")


def _resource(spec: specs_pb2.ResourceSpec, lookup: Lookup) -> None:
    if not spec.type:
        raise invalid("spec.type", "must name a resource type")
    resource_type: Any = lookup("resource_type", spec.type)
    # Whether the folder exists and lies inside the resource roots: Registries asks the
    # server's policy, which knows the namespace.
    directory = resource_type is not None and resource_type.spec.driver == "directory"
    if directory and (not spec.path or not os.path.isabs(spec.path)):
        raise invalid("spec.path", "must be an absolute path on the server")


def _project(spec: specs_pb2.ProjectSpec, lookup: Lookup) -> None:
    if not spec.resources:
        raise invalid("spec.resources", "a project needs at least one resource")


def _action(spec: specs_pb2.ActionSpec, lookup: Lookup) -> None:
    if not spec.actor:
        raise invalid("spec.actor", "must name an actor")
    if spec.HasField("inputs_schema"):
        check_json_schema("spec.inputs_schema", spec.inputs_schema)
    seen: set[str] = set()
    for i, step in enumerate(spec.steps):
        if not step.tool:
            raise invalid(f"spec.steps[{i}].tool", "must name a tool")
        step.id = step.id or f"step-{i + 1}"
        if step.id in seen:
            raise invalid(f"spec.steps[{i}].id", f"step id {step.id!r} is used twice")
        seen.add(step.id)


def _automation_profile(spec: specs_pb2.AutomationProfileSpec, lookup: Lookup) -> None:
    if not 0 <= spec.max_steps <= MAX_MAX_STEPS:
        raise invalid(
            "spec.max_steps", f"must be between 1 and {MAX_MAX_STEPS} (0: the default, {DEFAULT_MAX_STEPS})"
        )
    spec.max_steps = spec.max_steps or DEFAULT_MAX_STEPS
    _non_negative("spec.cost_budget", spec.cost_budget)
    approval_rules.check(spec.approval)


def _invariant(spec: specs_pb2.InvariantSpec, lookup: Lookup) -> None:
    rule = spec.WhichOneof("rule")
    if rule is None:
        raise invalid("spec.rule", "set exactly one of paths_within, max_files_changed, forbid_regex")
    if rule == "paths_within":
        if not spec.paths_within.globs:
            raise invalid("spec.paths_within.globs", "needs at least one glob")
        _globs("spec.paths_within.globs", spec.paths_within.globs)
    elif rule == "max_files_changed":
        if spec.max_files_changed.limit <= 0:
            raise invalid("spec.max_files_changed.limit", "must be > 0")
    else:
        _regex("spec.forbid_regex.pattern", spec.forbid_regex.pattern)
        _globs("spec.forbid_regex.paths", spec.forbid_regex.paths)


_VALIDATORS: Mapping[str, Callable[[Any, Lookup], None]] = MappingProxyType(
    {
        "action": _action,
        "actor": _actor,
        "automation_profile": _automation_profile,
        "invariant": _invariant,
        "project": _project,
        "resource": _resource,
        "resource_type": _resource_type,
        "skill": _skill,
        "tool": _tool,
        "validation": _validation,
    }
)


def check_spec(kind: str, spec: message.Message, lookup: Lookup) -> None:
    """Validate ``spec`` in place (filling defaults) or raise INVALID_PARAMS."""
    _VALIDATORS[kind](spec, lookup)
