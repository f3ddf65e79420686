"""Issue 17, finding 9 (export and import): a session history over the body limit made gRPC
GetSession/ExportSession fail for good with a bare RESOURCE_EXHAUSTED, and an export over
``--max-body-bytes`` could not be imported again. Now session.import takes requests up to a
whole export document (``limits.import_limit``) on every transport, session.export makes no
document larger than that (INVALID_STATE ``SESSION_TOO_LARGE``), and any other request stays
held to the body limit."""

from __future__ import annotations

import pathlib
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from ulid import ULID

from cleveragents.acp.contract import catalog, limits
from cleveragents.acp.contract.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import session_pb2
from tests.conformance.backends import KINDS, open_backend
from tests.security.test_bounds_limits import in_own_loop
from tests.server_process import Tokens

# A message as long as session.tell takes.
CONTENT = "m" * 100_000


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    return Tokens.create(tmp_path_factory.mktemp("export-tokens"))


async def document_of(alice: ACPClient, messages: int) -> dict[str, Any]:
    """An export document of a fresh session, given ``messages`` long messages."""
    session_id = (await alice.call("session.create", title="long")).session.meta.id  # type: ignore[attr-defined]
    exported = await alice.call("session.export", session_id=session_id)
    document: dict[str, Any] = json_format.MessageToDict(exported.document)  # type: ignore[attr-defined]
    await alice.call("session.delete", session_id=session_id)
    stamp = document["session"]["meta"]["create_time"]
    document["messages"] = [
        {
            "id": str(ULID()),
            "index": index,
            "role": "MESSAGE_ROLE_USER",
            "content": CONTENT,
            "create_time": stamp,
        }
        for index in range(messages)
    ]
    document["session"]["message_count"] = messages
    return document


async def imported(alice: ACPClient, document: dict[str, Any], **params: Any) -> str:
    response = await alice.call("session.import", {"document": document, **params})
    return str(response.session.meta.id)  # type: ignore[attr-defined]


async def refused(action: Any, code: str) -> ACPError:
    with pytest.raises(ACPError) as info:
        await action
    assert info.value.code == code, info.value
    return info.value


@pytest.mark.parametrize("kind", KINDS)
def test_a_history_over_the_body_limit_round_trips(kind: str, tmp_path: pathlib.Path, tokens: Tokens) -> None:
    """With the default limits: a 5 MB history (over the 4 MiB body and gRPC message limit)
    imports, shows, exports and imports again, and what comes back is what went in."""

    async def body() -> None:
        async with open_backend(kind, tmp_path, tokens) as backend:
            alice = backend.client("alice")
            document = await document_of(alice, 50)
            session_id = await imported(alice, document)
            shown = await alice.call("session.show", session_id=session_id)
            assert isinstance(shown, session_pb2.GetSessionResponse)
            assert shown.ByteSize() > limits.DEFAULT_MAX_BODY_BYTES
            assert [m.content for m in shown.messages] == [CONTENT] * 50
            exported = await alice.call("session.export", session_id=session_id)
            again = json_format.MessageToDict(exported.document)  # type: ignore[attr-defined]
            assert [(m["id"], m["content"]) for m in again["messages"]] == [
                (m["id"], m["content"]) for m in document["messages"]
            ]
            copy = await imported(alice, again, new_id=True)
            assert copy != session_id
            copied = await alice.call("session.show", session_id=copy)
            assert list(copied.messages) == list(shown.messages)  # type: ignore[attr-defined]
            if kind != "local":
                # Any other request is held to the body limit still.
                big = alice.call("session.create", title="x" * (5 * 1024 * 1024))
                err = await refused(big, "INVALID_PARAMS")
                assert err.details["max_bytes"] == limits.DEFAULT_MAX_BODY_BYTES, err

    in_own_loop(body)


@pytest.mark.parametrize("kind", KINDS)
def test_export_makes_nothing_import_refuses(
    kind: str, tmp_path: pathlib.Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a 64 KiB body limit and a 1 MiB document limit: a document between the two
    imports; one past the document limit is refused at import; a session grown past it is
    refused at export with SESSION_TOO_LARGE, never exported as something import refuses."""
    monkeypatch.setattr(limits, "MAX_SESSION_DOCUMENT_BYTES", 1024 * 1024)
    body_limit = 64 * 1024

    async def body() -> None:
        async with open_backend(kind, tmp_path, tokens, max_body_bytes=body_limit) as backend:
            alice = backend.client("alice")
            session_id = await imported(alice, await document_of(alice, 9))
            exported = await alice.call("session.export", session_id=session_id)
            await imported(alice, json_format.MessageToDict(exported.document), new_id=True)  # type: ignore[attr-defined]
            over = await document_of(alice, 12)
            if kind != "local":
                err = await refused(imported(alice, over), "INVALID_PARAMS")
                assert err.details["max_bytes"] == limits.import_limit(body_limit), err
            for _ in range(3):
                # Each under the body limit; together past the document limit.
                await alice.call("session.tell", session_id=session_id, content="t" * 60_000)
            err = await refused(alice.call("session.export", session_id=session_id), "INVALID_STATE")
            assert err.details["refinement"] == "SESSION_TOO_LARGE", err
            assert err.details["max_bytes"] == limits.MAX_SESSION_DOCUMENT_BYTES
            if kind != "local":
                err = await refused(
                    alice.call("session.create", title="x" * (2 * body_limit)), "INVALID_PARAMS"
                )
                assert err.details["max_bytes"] == body_limit, err

    in_own_loop(body)


@pytest.mark.parametrize("kind", KINDS)
def test_a_long_history_reads_in_pages(kind: str, tmp_path: pathlib.Path, tokens: Tokens) -> None:
    """session.show pages the history (ACP 1.2) when asked: a stock gRPC client, whose
    receive limit is 4 MiB, reads a 5 MB history a page at a time instead of failing for
    good with RESOURCE_EXHAUSTED; without page_size the whole history comes at once (1.1)."""

    async def body() -> None:
        async with open_backend(kind, tmp_path, tokens) as backend:
            alice = backend.client("alice")
            session_id = await imported(alice, await document_of(alice, 50))
            seen: list[str] = []
            token = ""
            for _ in range(10):
                page = await alice.call("session.show", session_id=session_id, page_size=20, page_token=token)
                assert isinstance(page, session_pb2.GetSessionResponse)
                assert len(page.messages) <= 20
                seen += [m.id for m in page.messages]
                token = page.next_page_token
                if not token:
                    break
            whole = await alice.call("session.show", session_id=session_id)
            assert seen == [m.id for m in whole.messages]  # type: ignore[attr-defined]
            assert whole.next_page_token == ""  # type: ignore[attr-defined]
            err = await refused(
                alice.call("session.show", session_id=session_id, page_size=5, page_token="forged"),
                "INVALID_PARAMS",
            )
            assert err.details["field"] == "page_token"
            if kind == "grpc":
                await stock_client_pages(backend.grpc_target, backend.token("alice") or "", session_id)

    in_own_loop(body)


async def stock_client_pages(target: str, token: str, session_id: str) -> None:
    op = catalog.OPERATIONS["session.show"]
    metadata = (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(target) as channel:
        show = channel.unary_unary(
            op.full_method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=session_pb2.GetSessionResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as whole:
            await show(session_pb2.GetSessionRequest(session_id=session_id), metadata=metadata, timeout=30)
        assert whole.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        count, page_token = 0, ""
        for _ in range(10):
            request = session_pb2.GetSessionRequest(
                session_id=session_id, page_size=25, page_token=page_token
            )
            page = await show(request, metadata=metadata, timeout=30)
            count += len(page.messages)
            page_token = page.next_page_token
            if not page_token:
                break
        assert count == 50
