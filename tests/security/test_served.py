"""The real ``agents serve``: finding 1 and 2 over HTTP and gRPC with a namespace token.
Resource roots per namespace, one refusal for every outside path, no commands unless the
operator allowed them, and start-up refusals for unusable settings."""

from __future__ import annotations

import pathlib
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade import auth
from cleveragents.acp.v1 import plan_pb2
from tests.server_process import ServerProcess, agents_command, start_server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str, pathlib.Path]]:
    directory = tmp_path_factory.mktemp("served-roots")
    roots = directory / "roots"
    for namespace in ("team-a", "team-b"):
        (roots / namespace / "repo").mkdir(parents=True)
        (roots / namespace / "repo" / "secret.txt").write_text(f"{namespace} only\n")
    tokens = directory / "tokens.toml"
    token = auth.create_token(tokens, "alice", ["team-a"], role="admin")
    server = start_server(directory, tokens=tokens, roots=[pathlib.Path(f"{roots}/{{namespace}}")])
    yield server, token, roots
    assert server.stop() == 0, server.stderr()


@pytest.mark.parametrize("kind", ["http", "grpc"])
async def test_a_team_a_token_reaches_only_team_a_folders(
    served: tuple[ServerProcess, str, pathlib.Path], kind: str
) -> None:
    server, token, roots = served
    transport = (
        HTTPTransport(httpx.AsyncClient(base_url=server.http, timeout=10), owns_client=True)
        if kind == "http"
        else GrpcTransport.connect(server.grpc_target, timeout=10)
    )
    client = ACPClient(transport, token=token)
    try:
        messages = set()
        for path in (roots / "team-b" / "repo", "/etc", "/no/such/folder"):
            with pytest.raises(ACPError) as info:
                await client.call(
                    "resource.add",
                    namespace="team-a",
                    name=f"probe-{kind}",
                    spec={"type": "directory", "path": str(path)},
                )
            assert info.value.code == "INVALID_PARAMS"
            messages.add(info.value.message)
        assert len(messages) == 1
        name = f"mine-{kind}"
        spec = {"type": "directory", "path": str(roots / "team-a" / "repo")}
        await client.call("resource.add", namespace="team-a", name=name, spec=spec)
        await client.call("tool.add", namespace="team-a", name=f"id-{kind}", spec={"argv": ["id"]})
        await client.call(
            "automation_profile.add",
            namespace="team-a",
            name=f"p-{kind}",
            spec={"allowed_tools": [f"id-{kind}"]},
        )
        await client.call("project.add", namespace="team-a", name=f"proj-{kind}", spec={"resources": [name]})
        await client.call(
            "action.add",
            namespace="team-a",
            name=f"act-{kind}",
            spec={"actor": "scripted", "steps": [{"tool": f"id-{kind}"}], "automation_profile": f"p-{kind}"},
        )
        used = await client.call("plan.use", action=f"act-{kind}", project=f"proj-{kind}", namespace="team-a")
        assert isinstance(used, plan_pb2.UsePlanResponse)
        done = await client.call("plan.execute", plan_id=used.plan.meta.id, wait=True)
        assert isinstance(done, plan_pb2.ExecutePlanResponse)
        assert done.plan.last_error.code == "commands_disabled"
    finally:
        await client.close()


def _serve_refusal(tmp_path: pathlib.Path, *flags: str) -> str:
    tokens = tmp_path / "tokens.toml"
    if not tokens.exists():
        auth.create_token(tokens, "x", ["default"])
    done = subprocess.run(
        agents_command("serve", "--tokens", str(tokens), "--db", str(tmp_path / "acp.db"), *flags),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    return done.stderr


def test_serve_refuses_unusable_settings(tmp_path: pathlib.Path) -> None:
    assert "absolute" in _serve_refusal(tmp_path, "--resource-root", "relative/dir")
    assert "placeholder" in _serve_refusal(tmp_path, "--resource-root", "/srv/{user}")
    assert "no user" in _serve_refusal(tmp_path, "--allow-commands", "--command-user", "no-such-user-x")
