"""context.* through the local client: configurations, inspection, path escapes, simulation."""

from __future__ import annotations

import math
import os
import pathlib
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.facade.domain.context.files import MAX_FILE_BYTES, MAX_FILES_PER_SOURCE
from cleveragents.acp.facade.domain.context.tokens import ByteEstimateCounter
from cleveragents.acp.v1 import context_pb2
from tests.facade.domain.session_helpers import add_folder, add_project, create, error_of

INCLUDED = context_pb2.ITEM_DISPOSITION_INCLUDED
TRUNCATED = context_pb2.ITEM_DISPOSITION_TRUNCATED
DROPPED = context_pb2.ITEM_DISPOSITION_DROPPED


def tokens(text: str) -> int:
    return math.ceil(len(text.encode()) / 4)


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """A resource folder with text, binary, oversized, hidden-VCS and symlinked entries."""
    root = tmp_path / "web"
    (root / "docs").mkdir(parents=True)
    (root / "src").mkdir()
    (root / ".git").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "README.md").write_text("# Web\n" + "readme " * 10)
    (root / "docs" / "guide.md").write_text("guide " * 40)
    (root / "src" / "app.py").write_text("print('hi')\n")
    (root / "data.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "big.txt").write_bytes(b"a" * (MAX_FILE_BYTES + 1))
    (root / ".git" / "config").write_text("[core]\n")
    os.symlink(root / "README.md", root / "link_in")
    os.symlink(outside / "secret.txt", root / "link_out")
    os.symlink(outside, root / "linkdir")
    os.symlink(root / "docs", root / "docs_link")
    return root


async def show(client: ACPClient, **scope: Any) -> context_pb2.GetContextResponse:
    response = await client.call("context.show", **scope)
    assert isinstance(response, context_pb2.GetContextResponse)
    return response


async def inspect(client: ACPClient, item_id: str, **scope: Any) -> context_pb2.ContextItem:
    response = await client.call("context.inspect", item_id=item_id, **scope)
    assert isinstance(response, context_pb2.InspectContextResponse)
    return response.item


async def simulate(client: ACPClient, **fields: Any) -> context_pb2.SimulateContextResponse:
    response = await client.call("context.simulate", **fields)
    assert isinstance(response, context_pb2.SimulateContextResponse)
    return response


def dispositions(response: context_pb2.SimulateContextResponse) -> list[tuple[str, str]]:
    return [(i.id, context_pb2.ItemDisposition.Name(i.disposition).split("_")[-1]) for i in response.items]


async def test_origins_session_project_default(client: ACPClient, folder: pathlib.Path) -> None:
    await add_project(client, "web", folder)
    await client.call("skill.add", name="tone", spec={"instructions": "Be brief."})
    session = await create(client, project="web")
    sid = session.meta.id

    default = await show(client, project="web")
    assert default.origin == "default"
    assert [s.resource for s in default.config.sources] == ["web-src"]
    assert list(default.config.sources[0].globs) == []
    assert default.token_counter == ByteEstimateCounter().description
    assert "estimate" in default.token_counter
    assert (await show(client, session_id=sid)).origin == "default"

    await client.call("context.set", project="web", config={"skills": ["tone"], "token_budget": 100})
    inherited = await show(client, session_id=sid)
    assert (inherited.origin, list(inherited.config.skills)) == ("project", ["tone"])

    own = await client.call(
        "context.set", session_id=sid, config={"sources": [{"resource": "web-src", "globs": ["**/*.md"]}]}
    )
    assert isinstance(own, context_pb2.SetContextResponse)
    assert list(own.config.sources[0].globs) == ["**/*.md"]
    mine = await show(client, session_id=sid)
    assert (mine.origin, list(mine.config.skills)) == ("session", [])
    assert (await show(client, project="web")).origin == "project"

    await client.call("context.set", session_id=sid, config={"token_budget": 7})
    assert (await show(client, session_id=sid)).config.token_budget == 7
    bare = await create(client)
    nothing = await show(client, session_id=bare.meta.id)
    assert (nothing.origin, list(nothing.config.sources)) == ("default", [])


async def test_scope_errors(client: ACPClient, folder: pathlib.Path) -> None:
    await add_project(client, "web", folder)
    session = await create(client, project="web")
    cases: list[tuple[str, dict[str, Any]]] = [
        ("context.show", {}),
        ("context.set", {"config": {}}),
        ("context.inspect", {"item_id": "skill:x"}),
        ("context.simulate", {}),
    ]
    for operation, extra in cases:
        err = await error_of(client, operation, **extra)
        assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "session_id"), operation
        err = await error_of(client, operation, session_id=session.meta.id, project="web", **extra)
        assert err.code == "INVALID_PARAMS", operation
        err = await error_of(client, operation, project="nope", **extra)
        assert (err.code, err.details["refinement"]) == ("NOT_FOUND", "PROJECT_NOT_FOUND"), operation
        err = await error_of(client, operation, session_id="01HZZZZZZZZZZZZZZZZZZZZZZZ", **extra)
        assert (err.code, err.details["refinement"]) == ("NOT_FOUND", "SESSION_NOT_FOUND"), operation
        err = await error_of(client, operation, session_id=session.meta.id, namespace="other", **extra)
        assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "namespace"), operation
    err = await error_of(client, "context.set", project="web")
    assert err.details["missing_fields"] == ["config"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"sources": [{"resource": ""}]}, "config.sources[0].resource"),
        ({"sources": [{"resource": "ghost"}]}, "config.sources[0].resource"),
        ({"sources": [{"resource": "web-src"}, {"resource": "web-src"}]}, "config.sources[1].resource"),
        ({"sources": [{"resource": "web-src", "globs": ["*.md", " "]}]}, "config.sources[0].globs[1]"),
        ({"sources": [{"resource": "web-src", "globs": ["/etc/*"]}]}, "config.sources[0].globs[0]"),
        ({"sources": [{"resource": "web-src", "globs": ["../*"]}]}, "config.sources[0].globs[0]"),
        ({"skills": [""]}, "config.skills[0]"),
        ({"skills": ["ghost"]}, "config.skills[0]"),
        ({"skills": ["tone", "tone"]}, "config.skills[1]"),
        ({"token_budget": -1}, "config.token_budget"),
    ],
)
async def test_set_validates(
    client: ACPClient, folder: pathlib.Path, config: dict[str, Any], field: str
) -> None:
    await add_project(client, "web", folder)
    await client.call("skill.add", name="tone", spec={"instructions": "Be brief."})
    err = await error_of(client, "context.set", project="web", config=config)
    assert (err.code, err.details["field"]) == ("INVALID_PARAMS", field)
    assert field in err.message
    assert (await show(client, project="web")).origin == "default"


async def test_inspect_items(client: ACPClient, folder: pathlib.Path) -> None:
    await add_project(client, "web", folder)
    await client.call("skill.add", name="tone", spec={"instructions": "Be brief."})
    await client.call(
        "context.set",
        project="web",
        config={"sources": [{"resource": "web-src"}], "skills": ["tone"]},
    )
    readme = await inspect(client, "file:web-src/README.md", project="web")
    text = (folder / "README.md").read_text()
    assert (readme.kind, readme.content, readme.tokens) == ("file", text, tokens(text))
    assert readme.source == f"{folder}/README.md"
    nested = await inspect(client, "file:web-src/docs/guide.md", project="web")
    assert nested.content.startswith("guide ")
    linked = await inspect(client, "file:web-src/link_in", project="web")
    assert linked.content == text
    skill = await inspect(client, "skill:tone", project="web")
    assert (skill.kind, skill.content, skill.tokens) == ("skill", "Be brief.", 3)


@pytest.mark.parametrize(
    ("item_id", "code"),
    [
        ("file:web-src/../outside/secret.txt", "INVALID_PARAMS"),
        ("file:web-src//etc/passwd", "INVALID_PARAMS"),
        ("file:web-src/./README.md", "INVALID_PARAMS"),
        ("file:web-src/docs\\guide.md", "INVALID_PARAMS"),
        ("file:web-src/link_out", "INVALID_PARAMS"),
        ("file:web-src/linkdir/secret.txt", "INVALID_PARAMS"),
        ("file:web-src/data.bin", "INVALID_PARAMS"),
        ("file:web-src/latin1.txt", "INVALID_PARAMS"),
        ("file:web-src/big.txt", "INVALID_PARAMS"),
        ("file:web-src", "INVALID_PARAMS"),
        ("file:", "INVALID_PARAMS"),
        ("nonsense", "INVALID_PARAMS"),
        ("prompt:x", "INVALID_PARAMS"),
        ("file:web-src/missing.md", "NOT_FOUND"),
        ("file:web-src/docs", "NOT_FOUND"),
        ("file:web-src/.git/config", "NOT_FOUND"),
        ("file:web-src/docs_link/guide.md", "NOT_FOUND"),
        ("file:other/README.md", "NOT_FOUND"),
        ("skill:tone", "NOT_FOUND"),
        ("skill:ghost", "NOT_FOUND"),
    ],
)
async def test_inspect_refuses(client: ACPClient, folder: pathlib.Path, item_id: str, code: str) -> None:
    await add_project(client, "web", folder)
    await client.call("skill.add", name="tone", spec={"instructions": "Be brief."})
    err = await error_of(client, "context.inspect", project="web", item_id=item_id)
    assert err.code == code, err.message
    if code == "NOT_FOUND":
        assert err.details["refinement"] == "CONTEXT_ITEM_NOT_FOUND"
    else:
        assert err.details["field"] == "item_id"


async def test_inspect_respects_globs(client: ACPClient, folder: pathlib.Path) -> None:
    await add_project(client, "web", folder)
    await client.call(
        "context.set", project="web", config={"sources": [{"resource": "web-src", "globs": ["docs/*.md"]}]}
    )
    assert (await inspect(client, "file:web-src/docs/guide.md", project="web")).kind == "file"
    err = await error_of(client, "context.inspect", project="web", item_id="file:web-src/README.md")
    assert err.code == "NOT_FOUND"
    assert "globs" in err.message


async def test_simulate_reports_every_item(client: ACPClient, folder: pathlib.Path) -> None:
    await add_project(client, "web", folder)
    await client.call("skill.add", name="tone", spec={"instructions": "Be brief."})
    await client.call(
        "context.set", project="web", config={"sources": [{"resource": "web-src"}], "skills": ["tone"]}
    )
    prompt = "Explain the project."
    readme = (folder / "README.md").read_text()
    # Budget: prompt, skill, README whole, then 5 tokens of docs/guide.md.
    budget = tokens(prompt) + 3 + tokens(readme) + 5
    result = await simulate(client, project="web", prompt=prompt, token_budget=budget)
    assert result.token_budget == budget
    assert dispositions(result) == [
        ("prompt", "INCLUDED"),
        ("skill:tone", "INCLUDED"),
        ("file:web-src/README.md", "INCLUDED"),
        ("file:web-src/big.txt", "DROPPED"),
        ("file:web-src/data.bin", "DROPPED"),
        ("file:web-src/docs/guide.md", "TRUNCATED"),
        ("file:web-src/latin1.txt", "DROPPED"),
        ("file:web-src/link_in", "DROPPED"),
        ("file:web-src/link_out", "DROPPED"),
        ("file:web-src/src/app.py", "DROPPED"),
    ]
    by_id = {i.id: i for i in result.items}
    assert (by_id["prompt"].tokens, by_id["prompt"].full_tokens) == (tokens(prompt), tokens(prompt))
    guide = by_id["file:web-src/docs/guide.md"]
    assert (guide.tokens, guide.full_tokens) == (5, 60)
    assert "only 5 of 60 tokens fit" in guide.reason
    assert "cap" in by_id["file:web-src/big.txt"].reason
    assert "binary" in by_id["file:web-src/data.bin"].reason
    assert "not UTF-8" in by_id["file:web-src/latin1.txt"].reason
    assert "outside the resource folder" in by_id["file:web-src/link_out"].reason
    assert "spent" in by_id["file:web-src/src/app.py"].reason
    assert by_id["file:web-src/src/app.py"].full_tokens == 3
    assert by_id["file:web-src/src/app.py"].tokens == 0
    assert result.total_tokens == budget
    assert [i.kind for i in result.items][:3] == ["prompt", "skill", "file"]


async def test_simulate_for_an_actor_counts_its_prompt_and_prices_the_result(
    client: ACPClient, folder: pathlib.Path
) -> None:
    await add_project(client, "web", folder)
    await client.call("skill.add", name="tone", spec={"instructions": "Be brief."})
    await client.call("skill.add", name="style", spec={"instructions": "Use plain words, short sentences."})
    system = "You review web projects."
    await client.call(
        "actor.add",
        name="reviewer",
        spec={
            "provider": "openai",
            "model": "m",
            "base_url": "http://127.0.0.1:1/v1",
            "system_prompt": system,
            "skills": ["style", "tone"],
            "cost_per_1k_tokens": 2.5,
        },
    )
    await client.call(
        "context.set", project="web", config={"sources": [{"resource": "web-src"}], "skills": ["tone"]}
    )
    prompt = "Explain the project."
    result = await simulate(client, project="web", prompt=prompt, actor="reviewer")
    ids = [i.id for i in result.items]
    assert ids[:4] == ["actor:reviewer", "skill:style", "skill:tone", "prompt"]
    assert ids.count("skill:tone") == 1
    assert result.items[0].kind == "system"
    assert result.items[0].tokens == tokens(system)
    plain = await simulate(client, project="web", prompt=prompt)
    extra = tokens(system) + tokens("Use plain words, short sentences.")
    assert result.total_tokens == plain.total_tokens + extra
    assert result.cost_per_1k_tokens == 2.5
    assert result.estimated_cost == pytest.approx(result.total_tokens / 1000 * 2.5)
    assert plain.estimated_cost == 0
    err = await error_of(client, "context.simulate", project="web", actor="nobody")
    assert err.code == "NOT_FOUND"
    older = ACPClient(client.transport, acp_version="1.1")
    old = await error_of(older, "context.simulate", project="web", actor="reviewer")
    assert (old.code, old.details["field"]) == ("VERSION_MISMATCH", "actor")
    answered = await older.call("context.simulate", project="web", prompt=prompt)
    assert isinstance(answered, context_pb2.SimulateContextResponse)


async def test_simulate_budgets(client: ACPClient, folder: pathlib.Path) -> None:
    await add_project(client, "web", folder)
    session = await create(client, project="web")
    roomy = await simulate(client, session_id=session.meta.id, prompt="hi")
    assert roomy.token_budget == 8000
    assert ("file:web-src/README.md", "INCLUDED") in dispositions(roomy)
    assert "TRUNCATED" not in {d for _, d in dispositions(roomy)}
    await client.call(
        "context.set",
        session_id=session.meta.id,
        config={"sources": [{"resource": "web-src"}], "token_budget": 4},
    )
    tight = await simulate(client, session_id=session.meta.id, prompt="x" * 40)
    assert tight.token_budget == 4
    first, *rest = tight.items
    assert (first.id, first.disposition, first.tokens, first.full_tokens) == ("prompt", TRUNCATED, 4, 10)
    assert all(i.disposition == DROPPED and i.tokens == 0 for i in rest)
    assert tight.total_tokens == 4
    err = await error_of(client, "context.simulate", session_id=session.meta.id, token_budget=-5)
    assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "token_budget")
    no_prompt = await simulate(client, session_id=session.meta.id, token_budget=10_000)
    assert "prompt" not in [i.id for i in no_prompt.items]


async def test_simulate_globs_and_missing_folder(
    client: ACPClient, folder: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    await add_project(client, "web", folder)
    gone = await add_folder(client, "gone", tmp_path / "gone")
    await client.call(
        "context.set",
        project="web",
        config={"sources": [{"resource": "web-src", "globs": ["**/*.md", "src/*"]}, {"resource": "gone"}]},
    )
    gone.rmdir()
    result = await simulate(client, project="web")
    assert dispositions(result) == [
        ("file:web-src/README.md", "INCLUDED"),
        ("file:web-src/docs/guide.md", "INCLUDED"),
        ("file:web-src/src/app.py", "INCLUDED"),
        ("resource:gone", "DROPPED"),
    ]
    assert "does not exist" in result.items[-1].reason


async def test_configurations_block_removing_their_resources_and_skills(
    client: ACPClient, folder: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    await add_project(client, "web", folder)
    await add_folder(client, "notes", tmp_path / "notes")
    await client.call("skill.add", name="tone", spec={"instructions": "Be brief."})
    session = await create(client)
    await client.call(
        "context.set",
        session_id=session.meta.id,
        config={"sources": [{"resource": "notes"}], "skills": ["tone"]},
    )
    for kind, name in [("resource", "notes"), ("skill", "tone")]:
        err = await error_of(client, f"{kind}.remove", name=name)
        assert err.code == "INVALID_STATE", kind
        assert err.details["referrers"] == [f"context/session:{session.meta.id}"]
    await client.call("context.set", session_id=session.meta.id, config={})
    await client.call("resource.remove", name="notes")
    await client.call("skill.remove", name="tone")


async def test_simulate_caps_files_per_source(client: ACPClient, tmp_path: pathlib.Path) -> None:
    many = tmp_path / "many"
    many.mkdir()
    for i in range(MAX_FILES_PER_SOURCE + 3):
        (many / f"f{i:05d}.txt").write_text("x")
    await add_project(client, "many", many)
    result = await simulate(client, project="many", token_budget=100_000)
    assert len(result.items) == MAX_FILES_PER_SOURCE + 1
    assert result.items[-2].id == f"file:many-src/f{MAX_FILES_PER_SOURCE - 1:05d}.txt"
    last = result.items[-1]
    assert (last.id, last.disposition) == ("resource:many-src", DROPPED)
    assert f"{MAX_FILES_PER_SOURCE + 3} files match" in last.reason
    assert result.total_tokens == MAX_FILES_PER_SOURCE
