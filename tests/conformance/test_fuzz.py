"""Fuzzing bad input against a real server (subprocess, token auth on).

schemathesis generates requests for every route of ``/api/v1/openapi.json`` (the REST
routes, the envelope endpoint, health) with a good token; hypothesis sends arbitrary JSON and
arbitrary bytes to the envelope endpoint. Nothing may answer 5xx, every answer is a valid
envelope, and answers conform to the document's schemas. ``ACP_FUZZ_EXAMPLES`` sets the
examples per route and per property (``make fuzz`` raises it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pathlib
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from schemathesis import checks

from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract import catalog, limits
from cleveragents.acp.gateway.http import openapi
from tests.conformance.backends import Backend, scratch
from tests.conformance.envelopes import envelope_problems, operation_of
from tests.conformance.generated import build_world
from tests.conformance.harness import Run
from tests.conformance.scenarios import REGISTRY_KINDS, entries
from tests.conformance.subjects import own_subjects, silent_model
from tests.server_process import ServerProcess, Tokens, start_server

EXAMPLES = int(os.environ.get("ACP_FUZZ_EXAMPLES", "4"))
STREAM_PATH = "/api/v1/events/stream"
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)


# Names and ids of what ``populate`` stored, by path parameter: the fuzzed routes draw them
# beside generated values, so show, update, remove and the plan verbs also reach real entities.
KNOWN: dict[str, list[str]] = {}


async def populate(server: ServerProcess, tokens: Tokens, directory: pathlib.Path) -> dict[str, list[str]]:
    """Store, over HTTP, what a server in use holds: entries of every registry kind, sessions
    (open, closed, with messages and context), plans in every state (pending, succeeded,
    applied, cancelled), built-ins; the contract suite's world and each operation's subject."""
    transport = HTTPTransport(httpx.AsyncClient(base_url=server.http, timeout=30), owns_client=True)
    try:
        run = Run(Backend("fuzz", scratch(directory), tokens, transport))
        world = await build_world(run)
        own = await own_subjects(run, world, "alice")
        await run.client().call("plan.cancel", own["plan.cancel"])
        await run.client().call("plan.apply", own["plan.apply"])
    finally:
        await transport.close()
    found: dict[str, set[str]] = {"name": {world["name"]}, "plan_id": {world["plan_id"]}, "session_id": set()}
    found["session_id"].add(world["session_id"])
    for params in own.values():
        for key, value in params.items():
            if key in found and isinstance(value, str):
                found[key].add(value)
    return {key: sorted(values) for key, values in found.items()}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Tokens]]:
    directory = tmp_path_factory.mktemp("fuzz")
    tokens = Tokens.create(directory)
    # A deep folder, so a glob that backtracks per segment would show it.
    (directory / "repo").joinpath(*["d"] * 24).mkdir(parents=True)
    (directory / "repo").joinpath(*["d"] * 24, "xyz.txt").write_text("x\n")
    # The subjects' queued turn waits behind a model that never answers: the server allows it.
    endpoint = ["--model-endpoint", silent_model().base_url]
    # The subjects' webhooks name a loopback receiver (tests/conformance/webhook_cases.py).
    webhooks = ["--webhook-allow-http", "--webhook-allow-network", "127.0.0.1/32"]
    server = start_server(directory, "--max-body-bytes", "65536", *endpoint, *webhooks, tokens=tokens.path)
    try:
        KNOWN.update(asyncio.run(populate(server, tokens, directory / "populated")))
        yield server, tokens
    finally:
        KNOWN.clear()
        assert server.stop() == 0, server.stderr()


# The document the gateway serves, built the same way here so each route is its own test
# (the served one is compared with it below).
schema = schemathesis.openapi.from_dict(openapi.document())


@schema.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> st.SearchStrategy[Any]:
    """The generated parameters, or the same with known names and ids put in."""
    if not path_parameters or not any(key in KNOWN for key in path_parameters):
        return st.just(path_parameters)
    known = {key: st.sampled_from(KNOWN[key]) for key in path_parameters if key in KNOWN}
    return st.just(path_parameters) | st.fixed_dictionaries(known).map(
        lambda drawn: {**path_parameters, **drawn}
    )


def conforms(method: str, raw_path: str, request_body: bytes, response: Any) -> None:
    assert response.status_code < 500, response.text
    if raw_path == "/api/v1/openapi.json":
        return
    headers = httpx.Headers(
        {key: value[0] if isinstance(value, list) else value for key, value in response.headers.items()}
    )
    assert headers["content-type"] == "application/json", headers
    body = orjson.loads(response.content)
    op = operation_of(method, raw_path, request_body)
    assert envelope_problems(body, op, status=response.status_code, headers=headers) == []


def test_the_fuzzed_server_is_populated(envelope_client: httpx.Client) -> None:
    """The fuzzing below meets a server in use: an entry of every registry kind, sessions open
    and closed, plans pending, succeeded, applied and cancelled."""
    for name, op in catalog.OPERATIONS.items():
        if op.verb != "list":
            continue
        items = entries(call_promptly(envelope_client, name, {"page_size": 500})["data"])
        if op.group in REGISTRY_KINDS:
            assert "w" in {item["name"] for item in items}, (name, items)
        else:
            assert items, name
    sessions = entries(call_promptly(envelope_client, "session.list", {"page_size": 500})["data"])
    assert {s["state"] for s in sessions} == {"SESSION_STATE_ACTIVE", "SESSION_STATE_CLOSED"}, sessions
    plans = entries(call_promptly(envelope_client, "plan.list", {"page_size": 500})["data"])
    states = {(p["phase"], p["state"]) for p in plans}
    assert states >= {
        ("PLAN_PHASE_STRATEGIZE", "PLAN_STATE_PENDING"),
        ("PLAN_PHASE_STRATEGIZE", "PLAN_STATE_CANCELLED"),
        ("PLAN_PHASE_EXECUTE", "PLAN_STATE_SUCCEEDED"),
        ("PLAN_PHASE_APPLY", "PLAN_STATE_SUCCEEDED"),
    }, states
    assert KNOWN["plan_id"], KNOWN
    assert KNOWN["session_id"], KNOWN


@schema.parametrize()
@FUZZ_SETTINGS
def test_every_route_of_the_openapi_document(case: Any, fuzzed: tuple[ServerProcess, Tokens]) -> None:
    server, tokens = fuzzed
    headers = {"Authorization": f"Bearer {tokens.tokens['root']}"}
    if case.path == STREAM_PATH:
        kwargs = case.as_transport_kwargs(base_url=server.http, headers=headers)
        with requests.request(**kwargs, stream=True, timeout=10) as streamed:
            if streamed.headers.get("content-type", "").startswith("text/event-stream"):
                assert streamed.status_code == 200
                assert next(streamed.iter_lines()) == b": stream open"
                return
            body = streamed.content
        conforms("GET", STREAM_PATH, b"", streamed)
        assert orjson.loads(body)["status"] == "error"
        return
    response = case.call(base_url=server.http, headers=headers, timeout=30)
    request = response.request
    raw_path = urllib.parse.urlsplit(request.url).path
    body = request.body if isinstance(request.body, bytes) else (request.body or "").encode()
    conforms(request.method, raw_path, body, response)
    case.validate_response(
        response,
        checks=[
            checks.not_a_server_error,
            checks.status_code_conformance,
            checks.content_type_conformance,
            checks.response_schema_conformance,
        ],
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
OPERATIONS = st.sampled_from(sorted(catalog.OPERATIONS))
ENVELOPES = st.fixed_dictionaries(
    {"operation": OPERATIONS},
    optional={
        "params": st.dictionaries(st.text(max_size=12), JSON, max_size=5),
        "acp_version": st.sampled_from(["1.0", "1.1", "2.0", ""]) | st.text(max_size=5),
        "request_id": st.text(max_size=30),
        "auth": st.fixed_dictionaries({"token": st.text(max_size=10)}) | JSON,
    },
)


@pytest.fixture(scope="module")
def envelope_client(fuzzed: tuple[ServerProcess, Tokens]) -> Iterator[httpx.Client]:
    server, tokens = fuzzed
    auth = {"Authorization": f"Bearer {tokens.tokens['root']}"}
    with httpx.Client(base_url=server.http, timeout=30, headers=auth) as client:
        yield client


def post(client: httpx.Client, content: bytes) -> None:
    """Any body: an envelope answers, never a server error."""
    response = client.post("/api/v1/acp", content=content, headers={"Content-Type": "application/json"})
    conforms("POST", "/api/v1/acp", content, response)


@given(body=JSON | ENVELOPES)
@settings(parent=FUZZ_SETTINGS, max_examples=EXAMPLES * 25)
def test_the_envelope_endpoint_takes_any_json(envelope_client: httpx.Client, body: Any) -> None:
    # The standard library writes integers of any size, which orjson refuses to.
    post(envelope_client, json.dumps(body).encode())


@given(content=st.binary(max_size=200))
@settings(parent=FUZZ_SETTINGS, max_examples=EXAMPLES * 10)
def test_the_envelope_endpoint_takes_any_bytes(envelope_client: httpx.Client, content: bytes) -> None:
    post(envelope_client, content)


def test_the_fuzzed_document_is_the_served_one(envelope_client: httpx.Client) -> None:
    served = envelope_client.get("/api/v1/openapi.json").json()
    served["info"]["description"] = schema.raw_schema["info"]["description"]
    assert served == schema.raw_schema
    assert len(list(schema.get_all_operations())) == len(catalog.OPERATIONS) + 2


# Caller-written regexes and globs (issue 19): built from pieces that make backtracking
# engines explode, that RE2 cannot run (backreferences, lookaround), and ECMA-262 oddities.
# Every one is registered and used; each call answers promptly, with success or INVALID_PARAMS.
PROMPT_SECONDS = 10.0
REGEX_PIECES = st.sampled_from(
    [
        "a",
        "a+",
        "(a+)+",
        "(a|aa)*",
        "(.*a){12}",
        "\\1",
        "(?=a)",
        "(?<!a)",
        "(?<n>a)",
        "\\k<n>",
        ".*",
        "[^]",
        "[]",
        "[",
        "]",
        "\\u0041",
        "\\uD800",
        "$",
        "^",
        "{2}",
        "{1001}",
        "|",
        "\\s",
        "\\p{L}",
        "\\",
        "\\z",
    ]
)
PATTERNS = st.lists(REGEX_PIECES, max_size=8).map("".join) | st.text(max_size=20)
GLOB_PIECES = st.sampled_from(["**", "**/", "*", "?", "[a-z]", "[!a]", "[z-a]", "d", "/", "x*y*z*w", "."])
GLOBS = st.lists(GLOB_PIECES, min_size=1, max_size=14).map("".join)
_NAMES = itertools.count()


def call_promptly(
    client: httpx.Client,
    operation: str,
    params: dict[str, Any],
    refusals: tuple[str, ...] = ("INVALID_PARAMS",),
) -> dict[str, Any]:
    """One operation through the envelope: ok or one of ``refusals``, within PROMPT_SECONDS."""
    content = json.dumps({"operation": operation, "params": params}).encode()
    began = time.monotonic()
    response = client.post("/api/v1/acp", content=content, headers={"Content-Type": "application/json"})
    elapsed = time.monotonic() - began
    conforms("POST", "/api/v1/acp", content, response)
    body: dict[str, Any] = orjson.loads(response.content)
    assert elapsed < PROMPT_SECONDS, (operation, params, elapsed)
    assert body["status"] == "ok" or body["error"]["code"] in refusals, body
    return body


@pytest.fixture(scope="module")
def fuzz_project(fuzzed: tuple[ServerProcess, Tokens], envelope_client: httpx.Client) -> str:
    server, _ = fuzzed
    folder = server.stderr_path.parent / "repo"
    resource = {"name": "fz-repo", "spec": {"type": "directory", "path": str(folder)}}
    call_promptly(envelope_client, "resource.add", resource)
    call_promptly(envelope_client, "project.add", {"name": "fz-proj", "spec": {"resources": ["fz-repo"]}})
    return "fz-proj"


@given(pattern=PATTERNS, word=st.text(alphabet="a!", max_size=60))
@settings(parent=FUZZ_SETTINGS, max_examples=EXAMPLES * 10)
def test_caller_patterns_answer_promptly(
    envelope_client: httpx.Client, fuzz_project: str, pattern: str, word: str
) -> None:
    name = f"fz-{next(_NAMES)}"
    schema = {"properties": {"w": {"type": "string", "pattern": pattern}}, "patternProperties": {pattern: {}}}
    action = {"name": name, "spec": {"actor": "scripted", "inputs_schema": schema}}
    if call_promptly(envelope_client, "action.add", action)["status"] == "ok":
        use = {"action": name, "project": fuzz_project, "inputs": {"w": word, word: 1}}
        call_promptly(envelope_client, "plan.use", use)
    call_promptly(envelope_client, "validation.add", {"name": name, "spec": {"regex": {"pattern": pattern}}})
    invariant = {"name": name, "spec": {"forbid_regex": {"pattern": pattern}}}
    call_promptly(envelope_client, "invariant.add", invariant)


@given(glob=GLOBS, path=st.text(alphabet="d/xyz.", max_size=60))
@settings(parent=FUZZ_SETTINGS, max_examples=EXAMPLES * 10)
def test_caller_globs_answer_promptly(
    envelope_client: httpx.Client, fuzz_project: str, glob: str, path: str
) -> None:
    config = {"sources": [{"resource": "fz-repo", "globs": [glob]}]}
    if (
        call_promptly(envelope_client, "context.set", {"project": fuzz_project, "config": config})["status"]
        == "ok"
    ):
        call_promptly(envelope_client, "context.simulate", {"project": fuzz_project, "prompt": "p"})
        inspect = {"project": fuzz_project, "item_id": f"file:fz-repo/{path}"}
        call_promptly(envelope_client, "context.inspect", inspect, refusals=("INVALID_PARAMS", "NOT_FOUND"))


# Issue 17: a repeated key anywhere in an envelope is INVALID_PARAMS, never a silent choice.
@given(body=ENVELOPES, depth=st.booleans())
@settings(parent=FUZZ_SETTINGS, max_examples=EXAMPLES * 5)
def test_the_envelope_endpoint_refuses_repeated_keys(
    envelope_client: httpx.Client, body: Any, depth: bool
) -> None:
    params = json.dumps(body.get("params") or {"x": 1})
    params = params[:-1] + (", " if params != "{}" else "") + '"dup": 1, "dup": 2}'
    content = json.dumps({**body, "params": {}}).replace(
        '"params": {}', f'"params": {params}' if depth else '"params": {}, "operation": "x"'
    )
    response = envelope_client.post(
        "/api/v1/acp", content=content.encode(), headers={"Content-Type": "application/json"}
    )
    conforms("POST", "/api/v1/acp", content.encode(), response)
    error = orjson.loads(response.content)["error"]
    assert error["code"] == "INVALID_PARAMS", error
    assert error["details"]["field"] == "body", error


# Any bytes a client can put in Last-Event-ID (h11 sends visible ASCII, obs-text, inner blanks).
HEADER_BYTES = st.sampled_from([*range(0x20, 0x7F), *range(0x80, 0x100)])
LAST_EVENT_IDS = st.lists(HEADER_BYTES | st.sampled_from(b"0123456789"), max_size=8).map(
    lambda b: bytes(b).strip()
)


@given(value=LAST_EVENT_IDS)
@example(value=b"\xb2")
@settings(parent=FUZZ_SETTINGS, max_examples=EXAMPLES * 10)
def test_the_stream_takes_any_last_event_id(envelope_client: httpx.Client, value: bytes) -> None:
    with envelope_client.stream("GET", STREAM_PATH, headers={b"Last-Event-ID": value}) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            assert response.status_code == 200
            return
        response.read()
    conforms("GET", STREAM_PATH, b"", response)


# Big plans (issue 19): arbitrary lists of file steps, up to a few hundred, with a fuzzed
# forbid_regex invariant; each runs to an end state and its apply answers, all promptly, and
# the plan's progress agrees with its steps.
PLAN_SECONDS = 60.0
FILE_STEPS = st.lists(
    st.tuples(st.sampled_from(["fs.write", "fs.replace", "fs.delete"]), st.integers(0, 20)),
    min_size=1,
    max_size=300,
)


def _file_step(tool: str, number: int) -> dict[str, Any]:
    path = f"fz-out/{number}.txt"
    if tool == "fs.write":
        return {"tool": tool, "args": {"path": path, "content": f"{number} aaa\n"}}
    if tool == "fs.replace":
        return {"tool": tool, "args": {"path": path, "old": "aaa", "new": "b"}}
    return {"tool": tool, "args": {"path": path}}


@given(steps=FILE_STEPS, pattern=PATTERNS)
@example(steps=[("fs.write", i % 21) for i in range(300)], pattern="a{3}")
@example(steps=[("fs.write", i) for i in range(300)], pattern="(a+)+$")
@settings(parent=FUZZ_SETTINGS, max_examples=EXAMPLES * 2)
def test_big_plans_run_and_apply_promptly(
    envelope_client: httpx.Client, fuzz_project: str, steps: list[tuple[str, int]], pattern: str
) -> None:
    name = f"fz-{next(_NAMES)}"
    invariant = {"name": name, "spec": {"forbid_regex": {"pattern": pattern, "paths": ["fz-out/**"]}}}
    guarded = call_promptly(envelope_client, "invariant.add", invariant)["status"] == "ok"
    spec = {
        "actor": "scripted",
        "steps": [_file_step(tool, number) for tool, number in steps],
        "invariants": [name] if guarded else [],
    }
    assert call_promptly(envelope_client, "action.add", {"name": name, "spec": spec})["status"] == "ok"
    used = call_promptly(envelope_client, "plan.use", {"action": name, "project": fuzz_project})
    plan_id = used["data"]["plan"]["meta"]["id"]
    began = time.monotonic()
    done = call_promptly(envelope_client, "plan.execute", {"plan_id": plan_id, "wait": True})
    assert time.monotonic() - began < PLAN_SECONDS
    plan = done["data"]["plan"]
    assert plan["state"] in ("PLAN_STATE_SUCCEEDED", "PLAN_STATE_FAILED"), plan
    progress = plan.get("progress", {})
    assert progress.get("total", 0) == len(steps)
    shown = call_promptly(envelope_client, "plan.tree", {"plan_id": plan_id})["data"]
    succeeded = [s for s in shown.get("steps", []) if s.get("state") == "PLAN_STATE_SUCCEEDED"]
    assert progress.get("done", 0) == len(succeeded)
    if plan["state"] == "PLAN_STATE_SUCCEEDED":
        assert len(succeeded) == len(steps)
        call_promptly(envelope_client, "plan.apply", {"plan_id": plan_id}, refusals=("INVALID_STATE",))


# Issue 17: label maps and identifiers around their bounds are accepted or INVALID_PARAMS.
@given(count=st.integers(0, limits.MAX_MAP_ENTRIES + 8), size=st.integers(0, limits.MAX_NAME_CHARS + 8))
@settings(parent=FUZZ_SETTINGS, max_examples=EXAMPLES * 5)
def test_labels_and_identifiers_around_their_bounds(
    envelope_client: httpx.Client, count: int, size: int
) -> None:
    labels = {f"k{index}": "v" * min(size, limits.MAX_MAP_VALUE_CHARS + 1) for index in range(count)}
    created = call_promptly(envelope_client, "session.create", {"labels": labels})
    fits = count <= limits.MAX_MAP_ENTRIES and (count == 0 or size <= limits.MAX_MAP_VALUE_CHARS)
    assert (created["status"] == "ok") == fits, created
    shown = call_promptly(
        envelope_client, "plan.status", {"plan_id": "p" * size}, ("INVALID_PARAMS", "NOT_FOUND")
    )
    assert (shown["error"]["code"] == "INVALID_PARAMS") == (size > limits.MAX_NAME_CHARS or size == 0), shown
