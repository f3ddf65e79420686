"""Command-line arguments derived from a request message's fields.

Required identifiers (REQUIRED string fields) are positional, in field order; every other
field is a ``--flag``: scalars take a value, bools are switches, repeated fields repeat,
enums take their value name without the enum prefix, maps and Structs take ``key=value``
(repeatable; Struct values parse as JSON when they can), and other messages take a
``FILE.json|FILE.yaml|-`` (or inline JSON).
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

from cleveragents.acp.facade.contract.required import required_fields

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


class InputError(Exception):
    """A value given on the command line cannot become the field it is for (exit 2)."""


@dataclass(frozen=True)
class Argument:
    field: descriptor.FieldDescriptor
    positional: bool

    @property
    def dest(self) -> str:
        return f"field__{self.field.name}"

    @property
    def flag(self) -> str:
        return "--" + self.field.name.replace("_", "-")


def _is_map(field: descriptor.FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _enum_prefix(enum: descriptor.EnumDescriptor) -> str:
    names = [v.name for v in enum.values if v.number != 0]
    prefix = enum.values[0].name.removesuffix("UNSPECIFIED") if enum.values else ""
    return prefix if all(n.startswith(prefix) for n in names) else ""


def enum_choices(enum: descriptor.EnumDescriptor) -> list[str]:
    prefix = _enum_prefix(enum)
    return [v.name.removeprefix(prefix).lower() for v in enum.values if v.number != 0]


def arguments(message: descriptor.Descriptor) -> list[Argument]:
    required = {f.name for f in required_fields(message)}
    result = []
    for field in message.fields:
        positional = field.name in required and field.type == FD.TYPE_STRING and not field.is_repeated
        result.append(Argument(field, positional))
    return result


def _help(field: descriptor.FieldDescriptor) -> str:
    if _is_map(field):
        return "KEY=VALUE, repeatable"
    if field.message_type is not None:
        if field.message_type.full_name == _STRUCT:
            return "KEY=VALUE (value parsed as JSON when it can be), repeatable; or @FILE.json|yaml, or -"
        if field.message_type.full_name == _FIELD_MASK:
            return "comma-separated field names"
        return f"{field.message_type.name} as FILE.json|FILE.yaml, - for stdin, or inline JSON"
    if field.enum_type is not None:
        return "one of: " + ", ".join(enum_choices(field.enum_type))
    return "repeatable" if field.is_repeated else ""


def add_arguments(parser: argparse.ArgumentParser, message: descriptor.Descriptor) -> list[Argument]:
    args = arguments(message)
    for arg in args:
        field = arg.field
        if arg.positional:
            parser.add_argument(arg.dest, metavar=field.name.upper(), help=f"{field.name} (required)")
            continue
        kwargs: dict[str, Any] = {"dest": arg.dest, "help": _help(field) or None, "default": None}
        if field.type == FD.TYPE_BOOL and not field.is_repeated:
            kwargs.update(action="store_true", default=None)
        elif _is_map(field) or field.is_repeated or field.message_type is not None:
            if field.message_type is None or _is_map(field) or field.message_type.full_name == _STRUCT:
                kwargs["action"] = "append"
            kwargs["metavar"] = "VALUE"
        elif field.enum_type is not None:
            kwargs["choices"] = enum_choices(field.enum_type)
            kwargs["metavar"] = field.name.upper()
        else:
            kwargs["metavar"] = field.name.upper()
        parser.add_argument(arg.flag, **kwargs)
    return args


def _scalar(field: descriptor.FieldDescriptor, text: str) -> Any:
    try:
        if field.type in _INTEGER_TYPES:
            return int(text)
        if field.type in _FLOAT_TYPES:
            return float(text)
    except ValueError:
        raise InputError(f"--{field.name.replace('_', '-')}: {text!r} is not a number") from None
    if field.enum_type is not None:
        return _enum_prefix(field.enum_type) + text.upper()
    return text


def read_document(source: str, what: str) -> Any:
    """JSON or YAML from a file, stdin (``-``) or inline text."""
    if source == "-":
        text = sys.stdin.read()
    elif source.lstrip().startswith(("{", "[")):
        text = source
    else:
        path = pathlib.Path(source.removeprefix("@"))
        try:
            text = path.read_text()
        except OSError as exc:
            raise InputError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{what}: not valid JSON or YAML: {exc}") from None


def _key_values(field: descriptor.FieldDescriptor, items: Sequence[str], parse_json: bool) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--{field.name.replace('_', '-')}: expected KEY=VALUE, got {item!r}")
        if parse_json:
            try:
                result[key] = json.loads(value)
            except ValueError:
                result[key] = value
        else:
            result[key] = value
    return result


def _value(field: descriptor.FieldDescriptor, raw: Any) -> Any:
    flag = "--" + field.name.replace("_", "-")
    if _is_map(field):
        return _key_values(field, raw, parse_json=False)
    if field.message_type is not None:
        full_name = field.message_type.full_name
        if full_name == _STRUCT:
            if len(raw) == 1 and (raw[0] == "-" or raw[0].startswith("@") or raw[0].lstrip().startswith("{")):
                document = read_document(raw[0], flag)
                if not isinstance(document, dict):
                    raise InputError(f"{flag}: expected an object")
                return document
            return _key_values(field, raw, parse_json=True)
        if full_name == _FIELD_MASK:
            return raw
        return read_document(raw, flag)
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
