"""Command-line arguments derived from a request message's fields.

Required identifiers (REQUIRED string fields) are positional, in field order; every other
field is a ``--flag`` (required when the field is): scalars take a value, bools are
switches, repeated fields repeat, enums take their value name without the enum prefix,
maps and Structs take ``KEY=VALUE`` (repeatable; Struct values parse as JSON when they
can), and other messages, or a whole Struct, take ``FILE.json|FILE.yaml``, ``-`` for
stdin, or inline JSON.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from google.protobuf import descriptor

from cleveragents.acp.contract import strict_json
from cleveragents.acp.contract.required import required_fields

FD = descriptor.FieldDescriptor
_STRUCT = "google.protobuf.Struct"
_FIELD_MASK = "google.protobuf.FieldMask"
_INTEGER_TYPES = {
    FD.TYPE_INT32,
    FD.TYPE_INT64,
    FD.TYPE_UINT32,
    FD.TYPE_UINT64,
    FD.TYPE_SINT32,
    FD.TYPE_SINT64,
}
_FLOAT_TYPES = {FD.TYPE_DOUBLE, FD.TYPE_FLOAT}
_DOCUMENT_METAVAR = "FILE|-|JSON"


class InputError(Exception):
    """A value given on the command line cannot become the field it is for (exit 2)."""


@dataclass(frozen=True)
class Argument:
    field: descriptor.FieldDescriptor
    positional: bool
    required: bool

    @property
    def dest(self) -> str:
        return f"field__{self.field.name}"

    @property
    def flag(self) -> str:
        return flag_of(self.field)


def flag_of(field: descriptor.FieldDescriptor) -> str:
    return "--" + field.name.replace("_", "-")


def is_map(field: descriptor.FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _is_struct(field: descriptor.FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.full_name == _STRUCT


def enum_prefix(enum: descriptor.EnumDescriptor) -> str:
    names = [v.name for v in enum.values if v.number != 0]
    prefix = enum.values[0].name.removesuffix("UNSPECIFIED") if enum.values else ""
    return prefix if all(n.startswith(prefix) for n in names) else ""


def enum_choices(enum: descriptor.EnumDescriptor) -> list[str]:
    prefix = enum_prefix(enum)
    return [v.name.removeprefix(prefix).lower() for v in enum.values if v.number != 0]


def arguments(message: descriptor.Descriptor) -> list[Argument]:
    required = {f.name for f in required_fields(message)}
    result = []
    for field in message.fields:
        is_required = field.name in required
        positional = is_required and field.type == FD.TYPE_STRING and not field.is_repeated
        result.append(Argument(field, positional, is_required))
    return result


def metavar(field: descriptor.FieldDescriptor) -> str:
    if is_map(field):
        return "KEY=VALUE"
    if _is_struct(field):
        return "KEY=VALUE|FILE"
    if field.message_type is not None:
        return "FIELDS" if field.message_type.full_name == _FIELD_MASK else _DOCUMENT_METAVAR
    return field.name.upper()


# Help of the plain fields, by request message and field, or by field name alone. The
# proto's comments do not reach the generated descriptors, so the words live here; a test
# holds every flag of every command to having some.
_FIELD_HELP: dict[str, str] = {
    "namespace": "the namespace (default 'default'; a list shows every one the token may read)",
    "description": "free text for people",
    "revision": "the revision you read; a stale one is INVALID_STATE",
    "diff_digest": "the digest of the plan.diff you reviewed (DIFF_CHANGED if the staged artifacts changed)",
    "page_size": "entries per page (default 50, at most 500)",
    "AnswerApprovalRequest.reason": "why, for the record (at most 2,000 characters)",
    "AnswerApprovalRequest.digest": "the digest of the request you reviewed (APPROVAL_VOID if it changed)",
    "page_token": "the next_page_token of the previous page",
    "session_id": "a session's id",
    "project": "a project's name",
    "actor": "an actor's name",
    "plan_id": "a plan's id",
    "after_sequence": "deliver events after this sequence (0: all retained)",
    "include_content": "include each artifact's content",
    "wait": "answer only when the execute phase has finished",
    "force": "restore even files that changed since apply",
    "automation_profile": "overrides the action's automation profile",
    "token_budget": "overrides the configured token budget",
    "title": "a title for people",
    "CreateSessionRequest.orchestrator": "the orchestrator actor's name (default: the built-in one)",
    "CreateSessionRequest.project": "the project the session works on",
    "ImportSessionRequest.new_id": "give the imported session a fresh id instead of the exported one",
    "SimulateContextRequest.prompt": "the prompt to assemble the context for",
    "SimulateContextRequest.actor": "an actor whose system prompt and skills come first, priced at its cost",
    "CancelPlanRequest.reason": "why, recorded with the plan's state change",
    "CorrectPlanRequest.text": "the correction, in words, for the actor",
    "TellSessionRequest.background": "answer at once with the queued turn; follow it with session turn",
    "CancelTurnRequest.cancel_plans": "also cancel the plans the turn started",
    "AddWebhookRequest.disabled": "start disabled (deliveries wait; the cursor stays)",
    "RotateWebhookSecretRequest.overlap_seconds": "how long the old secret stays valid beside the new one",
    "UpdateWebhookRequest.url": "the new receiver URL (checked as at add)",
    "UpdateWebhookRequest.enabled": "deliver (true) or hold deliveries (false); name it in --update-mask",
    "ReplayWebhookRequest.from_sequence": "deliver again from this event sequence on",
    "AddWebhookRequest.cursor": "deliver the events after this sequence (default 0: only events from now on)",
}


def _plain_help(field: descriptor.FieldDescriptor) -> str:
    owner = field.containing_type.name if field.containing_type is not None else ""
    own = _FIELD_HELP.get(f"{owner}.{field.name}")
    if own:
        return own
    if field.name == "revision" and owner.startswith("Remove"):
        return "refuse the removal unless the entry is still at this revision"
    return _FIELD_HELP.get(field.name, "")


def _help(field: descriptor.FieldDescriptor) -> str:
    if is_map(field):
        return "repeatable"
    if field.message_type is not None:
        if _is_struct(field):
            return (
                "KEY=VALUE (the value parsed as JSON when it can be), repeatable; or the whole "
                "object from FILE.json|yaml, - (stdin) or inline JSON"
            )
        if field.message_type.full_name == _FIELD_MASK:
            return "comma-separated field names"
        many = "a list of " if field.is_repeated else ""
        return f"{many}{field.message_type.name} from FILE.json|yaml, - (stdin) or inline JSON"
    if field.enum_type is not None:
        return "one of: " + ", ".join(enum_choices(field.enum_type))
    text = _plain_help(field)
    return (
        f"{text} (repeatable)"
        if field.is_repeated and text
        else text or ("repeatable" if field.is_repeated else "")
    )


def add_arguments(parser: argparse.ArgumentParser, message: descriptor.Descriptor) -> list[Argument]:
    args = arguments(message)
    for arg in args:
        field = arg.field
        if arg.positional:
            parser.add_argument(arg.dest, metavar=field.name.upper(), help=f"{field.name} (required)")
            continue
        kwargs: dict[str, Any] = {
            "dest": arg.dest,
            "help": _help(field) or None,
            "default": None,
            "metavar": metavar(field),
        }
        if arg.required:
            kwargs["required"] = True
        if field.type == FD.TYPE_BOOL and not field.is_repeated:
            kwargs.update(action="store_true")
            del kwargs["metavar"]
        elif is_map(field) or _is_struct(field) or (field.is_repeated and field.message_type is None):
            kwargs["action"] = "append"
        elif field.enum_type is not None:
            kwargs["choices"] = enum_choices(field.enum_type)
        parser.add_argument(arg.flag, **kwargs)
    return args


def _scalar(field: descriptor.FieldDescriptor, text: str) -> Any:
    try:
        if field.type in _INTEGER_TYPES:
            return int(text)
        if field.type in _FLOAT_TYPES:
            return float(text)
    except ValueError:
        raise InputError(f"{flag_of(field)}: {text!r} is not a number") from None
    if field.enum_type is not None:
        return enum_prefix(field.enum_type) + text.upper()
    return text


def read_document(source: str, what: str) -> Any:
    """JSON or YAML from a file (``@`` prefix optional), stdin (``-``) or inline text."""
    if source == "-":
        text = sys.stdin.read()
    elif source.lstrip().startswith(("{", "[")):
        text = source
    else:
        path = pathlib.Path(source.removeprefix("@"))
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise InputError(f"{what}: cannot read {path}: {reason}") from None
    try:
        return json.loads(text, object_pairs_hook=strict_json.unique_pairs)
    except strict_json.DuplicateKeyError as exc:
        raise InputError(f"{what}: {exc}") from None
    except ValueError as exc:
        json_error = exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{what}: not valid JSON or YAML: {_syntax(text, json_error, exc)}") from None


def _syntax(text: str, json_error: ValueError, yaml_error: yaml.YAMLError) -> str:
    """Where the document is broken, in the words of the syntax it looks like: JSON's when
    it starts like JSON, YAML's otherwise."""
    if isinstance(json_error, json.JSONDecodeError) and text.lstrip().startswith(("{", "[")):
        return f"line {json_error.lineno}, column {json_error.colno}: {json_error.msg} (as JSON)"
    mark = getattr(yaml_error, "problem_mark", None)
    problem = getattr(yaml_error, "problem", None) or str(yaml_error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem} (as YAML)"


def _document(field: descriptor.FieldDescriptor, source: str) -> Any:
    """A message (or list of messages) from a document. A document shaped like the response
    that printed it, ``{"<field>": value}`` (what ``--json`` shows), is accepted too."""
    flag = flag_of(field)
    value = read_document(source, flag)
    assert field.message_type is not None
    if (
        isinstance(value, dict)
        and list(value) == [field.name]
        and field.name not in field.message_type.fields_by_name
    ):
        value = value[field.name]
    if field.is_repeated:
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise InputError(f"{flag}: expected a list of objects ({field.message_type.name})")
    elif not isinstance(value, dict):
        kind = "nothing" if value is None else f"a {type(value).__name__}"
        raise InputError(f"{flag}: expected an object ({field.message_type.name}), got {kind}")
    return value


def _names_document(value: str) -> bool:
    """``-``, ``@FILE``, inline JSON, or a bare path (no ``=``): a whole Struct, not KEY=VALUE."""
    return value == "-" or value.startswith("@") or value.lstrip().startswith("{") or "=" not in value


def _key_values(field: descriptor.FieldDescriptor, items: Sequence[str], parse_json: bool) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"{flag_of(field)}: expected KEY=VALUE, got {item!r}")
        if parse_json:
            try:
                result[key] = json.loads(value)
            except ValueError:
                result[key] = value
        else:
            result[key] = value
    return result


def _value(field: descriptor.FieldDescriptor, raw: Any) -> Any:
    if is_map(field):
        return _key_values(field, raw, parse_json=False)
    if field.message_type is not None:
        full_name = field.message_type.full_name
        if full_name == _STRUCT:
            if len(raw) == 1 and _names_document(raw[0]):
                return _document(field, raw[0])
            return _key_values(field, raw, parse_json=True)
        if full_name == _FIELD_MASK:
            return raw
        return _document(field, raw)
    if field.is_repeated:
        return [_scalar(field, item) for item in raw]
    return _scalar(field, raw)


def params(args: argparse.Namespace, spec: Sequence[Argument]) -> dict[str, Any]:
    """The request params (proto JSON, field names) the parsed arguments describe."""
    result: dict[str, Any] = {}
    for arg in spec:
        raw = getattr(args, arg.dest, None)
        if raw is None:
            continue
        result[arg.field.name] = raw if arg.field.type == FD.TYPE_BOOL else _value(arg.field, raw)
    return result


def _type_name(field: descriptor.FieldDescriptor) -> str:
    if is_map(field):
        return "{KEY: VALUE}"
    if field.message_type is not None:
        name = "object" if _is_struct(field) else field.message_type.name
    elif field.enum_type is not None:
        name = " | ".join(enum_choices(field.enum_type))
    else:
        name = {FD.TYPE_BOOL: "true | false", FD.TYPE_STRING: "string", FD.TYPE_BYTES: "base64"}.get(
            field.type, "number"
        )
    return f"[{name}]" if field.is_repeated else name


def skeleton(message: descriptor.Descriptor, indent: str = "  ", depth: int = 3) -> list[str]:
    """The fields of a message as an indented YAML-like outline, for ``--help``."""
    lines = []
    for field in message.fields:
        lines.append(f"{indent}{field.name}: {_type_name(field)}")
        nested = field.message_type
        expand = nested is not None and nested.full_name not in (_STRUCT, _FIELD_MASK)
        if expand and nested is not None and depth > 1 and not is_map(field):
            lines += skeleton(nested, indent + "  ", depth - 1)
    return lines


def documents(message: descriptor.Descriptor) -> list[descriptor.FieldDescriptor]:
    """The fields that take a whole message from a document (their shape goes in --help)."""
    return [
        f
        for f in message.fields
        if f.message_type is not None
        and not is_map(f)
        and f.message_type.full_name not in (_STRUCT, _FIELD_MASK)
    ]
