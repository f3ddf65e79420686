"""The OpenAPI 3.1 document of the gateway, derived from the proto descriptors.

Schemas follow the codec's proto3 JSON (proto field names; int64 as strings; enums as
names; well-known types in their JSON forms). Each REST route gets its path and query
parameters and body from the ``google.api.http`` rule, and answers an envelope whose
``data`` is the RPC's response message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from google.api import field_behavior_pb2
from google.protobuf import descriptor, message

from cleveragents.acp.contract import catalog, revisions, surface
from cleveragents.acp.contract.catalog import Catalog, Major, Operation
from cleveragents.acp.contract.errors import TABLE
from cleveragents.acp.gateway.http.routing import ENVELOPE_SUFFIX, HEALTH_PATH, VARIABLE
from cleveragents.acp.v1 import envelope_pb2

FD = descriptor.FieldDescriptor
_REF = "#/components/schemas/"

_SCALARS: Mapping[int, dict[str, Any]] = {
    FD.TYPE_STRING: {"type": "string"},
    FD.TYPE_BOOL: {"type": "boolean"},
    FD.TYPE_BYTES: {"type": "string", "contentEncoding": "base64"},
    FD.TYPE_DOUBLE: {"type": "number"},
    FD.TYPE_FLOAT: {"type": "number"},
    FD.TYPE_INT32: {"type": "integer", "format": "int32"},
    FD.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FD.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    FD.TYPE_UINT32: {"type": "integer", "format": "int64", "minimum": 0},
    FD.TYPE_FIXED32: {"type": "integer", "format": "int64", "minimum": 0},
    # proto3 JSON writes 64-bit integers as strings (and reads either form).
    FD.TYPE_INT64: {"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"},
    FD.TYPE_SINT64: {"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"},
    FD.TYPE_SFIXED64: {"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"},
    FD.TYPE_UINT64: {"type": "string", "format": "uint64", "pattern": "^[0-9]+$"},
    FD.TYPE_FIXED64: {"type": "string", "format": "uint64", "pattern": "^[0-9]+$"},
}

_WELL_KNOWN: Mapping[str, dict[str, Any]] = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {"type": "string", "pattern": "^-?[0-9]+(\\.[0-9]+)?s$"},
    "google.protobuf.FieldMask": {"type": "string"},
    "google.protobuf.Struct": {"type": "object", "additionalProperties": True},
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array", "items": {}},
    "google.protobuf.Empty": {"type": "object", "additionalProperties": False},
    "google.protobuf.Any": {"type": "object", "properties": {"@type": {"type": "string"}}},
    "google.protobuf.StringValue": {"type": ["string", "null"]},
    "google.protobuf.BoolValue": {"type": ["boolean", "null"]},
    "google.protobuf.DoubleValue": {"type": ["number", "null"]},
    "google.protobuf.FloatValue": {"type": ["number", "null"]},
    "google.protobuf.Int32Value": {"type": ["integer", "null"]},
    "google.protobuf.UInt32Value": {"type": ["integer", "null"]},
    "google.protobuf.Int64Value": {"type": ["string", "null"]},
    "google.protobuf.UInt64Value": {"type": ["string", "null"]},
    "google.protobuf.BytesValue": {"type": ["string", "null"]},
}


def _desc(cls: type[message.Message]) -> descriptor.Descriptor:
    return cast(descriptor.Descriptor, cls.DESCRIPTOR)


def _required(field: descriptor.FieldDescriptor) -> bool:
    return field_behavior_pb2.REQUIRED in field.GetOptions().Extensions[field_behavior_pb2.field_behavior]


class SchemaBuilder:
    """Message schemas as reusable components, each message described once."""

    def __init__(self) -> None:
        self.components: dict[str, dict[str, Any]] = {}

    def ref(self, desc: descriptor.Descriptor) -> dict[str, Any]:
        if desc.full_name in _WELL_KNOWN:
            return dict(_WELL_KNOWN[desc.full_name])
        if desc.full_name not in self.components:
            self.components[desc.full_name] = {}
            self.components[desc.full_name] = self._message(desc)
        return {"$ref": _REF + desc.full_name}

    def _value(self, field: descriptor.FieldDescriptor) -> dict[str, Any]:
        if field.message_type is not None:
            return self.ref(field.message_type)
        if field.enum_type is not None:
            return {"type": "string", "enum": [value.name for value in field.enum_type.values]}
        return dict(_SCALARS[field.type])

    def field(self, field: descriptor.FieldDescriptor) -> dict[str, Any]:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            return {"type": "object", "additionalProperties": self._value(value_field)}
        schema = self._value(field)
        if field.is_repeated:
            schema = {"type": "array", "items": schema}
        elif "$ref" in schema:
            # proto3 JSON reads null as an unset message field, and the envelope writes
            # `error: null` beside data (and `data: null` beside an error).
            schema = {"anyOf": [schema, {"type": "null"}]}
        if field.containing_oneof is not None and not field.containing_oneof.name.startswith("_"):
            schema = {**schema, "description": f"One of the `{field.containing_oneof.name}` fields."}
        since = surface.field_since(field)
        if since is not None:
            schema = {**schema, "x-acp-since": since}
        return schema

    def _message(self, desc: descriptor.Descriptor) -> dict[str, Any]:
        schema: dict[str, Any] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {field.name: self.field(field) for field in desc.fields},
        }
        required = [field.name for field in desc.fields if _required(field)]
        if required:
            schema["required"] = required
        return schema


def _scalar_map(field: descriptor.FieldDescriptor) -> bool:
    """A map whose values are scalars, which a query string can carry entry by entry."""
    entry = field.message_type
    return (
        entry is not None
        and entry.GetOptions().map_entry
        and entry.fields_by_name["value"].message_type is None
    )


def _parameters(op: Operation, builder: SchemaBuilder) -> list[dict[str, Any]]:
    table = op.version_table
    desc = _desc(op.request_type)
    params: list[dict[str, Any]] = []
    for path in op.http.path_params:
        params.append({"name": path, "in": "path", "required": True, "schema": {"type": "string"}})
    if op.http.body == "":
        for field in desc.fields:
            if field.name in op.http.path_params:
                continue
            if _scalar_map(field):
                params.append(
                    {
                        "name": field.name,
                        "in": "query",
                        "style": "deepObject",
                        "explode": True,
                        "schema": builder.field(field),
                        "description": f"Entries as `{field.name}[key]=value` (or `{field.name}.key=value`).",
                    }
                )
                continue
            if field.message_type is not None and field.message_type.full_name not in (
                "google.protobuf.Timestamp",
                "google.protobuf.Duration",
                "google.protobuf.FieldMask",
            ):
                continue
            param: dict[str, Any] = {"name": field.name, "in": "query", "schema": builder.field(field)}
            if field.is_repeated:
                param["explode"] = True
            params.append(param)
    params.append(
        {
            "name": "ACP-Version",
            "in": "header",
            "schema": {"type": "string", "enum": list(table.supported)},
            "description": f"The ACP version spoken; {table.current} when absent.",
        }
    )
    params.append(
        {
            "name": "X-Request-ID",
            "in": "header",
            "schema": {"type": "string", "maxLength": 128},
            "description": "Echoed in the envelope; a ULID is generated when absent.",
        }
    )
    if op.if_revision:
        params.append(
            {
                "name": "If-Match",
                "in": "header",
                "schema": {"type": "string", "pattern": '^"[1-9][0-9]{0,9}"$'},
                "description": f'The {op.if_revision}\'s `ETag` as read (one strong tag, `"7"`; '
                f"ACP {revisions.SINCE}): the call changes nothing and answers 412 when the "
                f"{op.if_revision} has moved since.",
                "x-acp-since": revisions.SINCE,
            }
        )
    if op.server_streaming:
        params.append(
            {
                "name": "Last-Event-ID",
                "in": "header",
                "schema": {"type": "string", "pattern": "^[0-9]+$"},
                "description": "Resume after this sequence (overrides after_sequence).",
            }
        )
        params.append(
            {
                "name": "ticket",
                "in": "query",
                "schema": {"type": "string"},
                "description": "A stream ticket from `events.ticket` (ACP 1.2), instead of the "
                "Authorization header: what a browser's EventSource sends. Single-use, short-lived, "
                "bound to the stream's filters.",
            }
        )
    return params


def _envelope_of(builder: SchemaBuilder, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "allOf": [
            builder.ref(_desc(envelope_pb2.ResponseEnvelope)),
            {"properties": {"data": {"anyOf": [data, {"type": "null"}]}}},
        ]
    }


def _errors(builder: SchemaBuilder) -> dict[str, Any]:
    statuses = sorted({mapping.http_status for mapping in TABLE.values()})
    error = {"$ref": _REF + "cleveragents.acp.v1.ResponseEnvelope"}
    return {
        str(status): {
            "description": ", ".join(code for code, m in TABLE.items() if m.http_status == status),
            "content": {"application/json": {"schema": error}},
        }
        for status in statuses
    }


def _operation(op: Operation, builder: SchemaBuilder) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "operationId": op.name,
        "summary": op.summary,
        "description": f"ACP operation `{op.name}` (since ACP {op.since}); gRPC `{op.full_method}`. "
        f"If the caller stops waiting: {op.abandoned}",
        "tags": [op.group],
        "parameters": _parameters(op, builder),
    }
    if op.http.body:
        spec["requestBody"] = {
            "required": False,
            "content": {"application/json": {"schema": builder.ref(_desc(op.request_type))}},
        }
    if op.server_streaming:
        ok = {
            "description": "Server-Sent Events: `id:` the sequence, `event:` the type, `data:` the item "
            "as JSON; an `event: error` frame carries an error envelope.",
            "content": {"text/event-stream": {"schema": builder.ref(_desc(op.response_type))}},
        }
    else:
        ok = {
            "description": "The envelope, with `data` the response.",
            "content": {
                "application/json": {"schema": _envelope_of(builder, builder.ref(_desc(op.response_type)))}
            },
        }
        if revisions.carries_entity(op.response_type):
            ok["headers"] = {
                "ETag": {
                    "description": f"The revision of the session or plan in `data` (ACP {revisions.SINCE}), "
                    "for a later write's `If-Match`.",
                    "schema": {"type": "string", "pattern": '^"[1-9][0-9]{0,9}"$'},
                }
            }
    responses = {"200": ok, **_errors(builder)}
    if op.if_revision:
        responses[str(revisions.PRECONDITION_FAILED)] = {
            "description": f"INVALID_STATE with the refinement {revisions.REVISION_MISMATCH}: the "
            f"{op.if_revision} is no longer at the `If-Match` revision (nothing changed). The "
            "envelope's stale `if_revision` answers 409 instead.",
            "content": {"application/json": {"schema": builder.ref(_desc(envelope_pb2.ResponseEnvelope))}},
        }
    spec["responses"] = responses
    if op.anonymous:
        spec["security"] = []
    elif op.server_streaming:
        spec["security"] = [{"bearer": []}, {"streamTicket": []}]
    else:
        spec["security"] = [{"bearer": []}]
    return spec


def _envelope_endpoint(builder: SchemaBuilder, major: Major, default: bool) -> dict[str, Any]:
    request = builder.ref(_desc(envelope_pb2.RequestEnvelope))
    operations = sorted(op.name for op in major.operations.values() if not op.server_streaming)
    table = major.version_table
    return {
        "post": {
            # The default major keeps the id it always had; the others say their major.
            "operationId": "acp.envelope" if default else f"acp.envelope.v{major.number}",
            "summary": f"Any ACP {major.number} operation in the canonical envelope.",
            "description": f"`operation` names any unary operation of ACP {major.number} "
            f"({', '.join(table.supported)}); `params` is its request message. The token goes in "
            "`Authorization: Bearer` or `auth.token`.",
            "tags": ["envelope"],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "allOf": [
                                request,
                                {
                                    "required": ["operation"],
                                    "properties": {"operation": {"type": "string", "enum": operations}},
                                },
                            ]
                        }
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "The envelope, with `data` the operation's response.",
                    "content": {
                        "application/json": {"schema": builder.ref(_desc(envelope_pb2.ResponseEnvelope))}
                    },
                },
                **_errors(builder),
            },
            "security": [{"bearer": []}, {}],
        }
    }


def document(server_build: str = "", contract: Catalog | None = None) -> dict[str, Any]:
    """Every major the gateway serves (default: the product catalog), each under its prefix;
    an operation of another major than the default gets the major in its operationId."""
    contract = contract or catalog.CATALOG
    builder = SchemaBuilder()
    paths: dict[str, dict[str, Any]] = {}
    for major in contract.majors.values():
        default = major is contract.default
        paths[major.prefix + ENVELOPE_SUFFIX] = _envelope_endpoint(builder, major, default)
        for op in major.operations.values():
            openapi_path = VARIABLE.sub(lambda m: "{" + m.group(1) + "}", op.http.path)
            spec = _operation(op, builder)
            if not default:
                spec["operationId"] = f"{op.name}.v{major.number}"
            paths.setdefault(openapi_path, {})[op.http.method.lower()] = spec
    paths[HEALTH_PATH] = {
        "get": {
            "operationId": "healthz",
            "summary": "Liveness: an envelope with `data.status` SERVING when the backend answers.",
            "responses": {
                "200": {
                    "description": "Serving.",
                    "content": {
                        "application/json": {"schema": builder.ref(_desc(envelope_pb2.ResponseEnvelope))}
                    },
                },
                **_errors(builder),
            },
            "security": [],
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "CleverAgents ACP",
            "version": contract.default.version_table.current,
            "description": "The Agent Client Protocol over JSON/HTTP. Every response is an envelope. "
            + f"Versions served: {', '.join(contract.served_versions())}. "
            + (f"Server: {server_build}." if server_build else ""),
            "x-acp-versions": contract.served_versions(),
        },
        "paths": paths,
        "components": {
            "schemas": builder.components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "streamTicket": {"type": "apiKey", "in": "query", "name": "ticket"},
            },
        },
        "security": [{"bearer": []}],
    }
