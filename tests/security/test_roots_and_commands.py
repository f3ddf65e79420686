"""Issue 17 findings 1 and 2: directory resources live inside the operator's resource
roots, and processes run only when the operator enabled them and an automation profile
the action registered allows them."""

from __future__ import annotations

import json
import pathlib
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.access.policy import Policy
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import PY, add_action, add_command_tool, add_profile, run, use, write_tree


@pytest.fixture
def roots(tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "roots"
    for namespace in ("team-a", "team-b"):
        write_tree(folder / namespace / "repo", {"secret.txt": f"{namespace} only\n".encode()})
    return folder


@pytest.fixture
async def server(tmp_path: pathlib.Path, roots: pathlib.Path) -> AsyncIterator[ACPClient]:
    """Server-mode policy: per-namespace roots, commands off."""
    facade = open_facade(tmp_path / "acp.db", policy=Policy.server([f"{roots}/{{namespace}}"]))
    client = ACPClient(LocalTransport(facade))
    try:
        yield client
    finally:
        await client.close()
        await facade.close()


async def _add_resource(
    client: ACPClient, namespace: str, path: str | pathlib.Path, name: str = "repo"
) -> None:
    await client.call(
        "resource.add", namespace=namespace, name=name, spec={"type": "directory", "path": str(path)}
    )


async def _refusal(client: ACPClient, namespace: str, path: str | pathlib.Path) -> ACPError:
    with pytest.raises(ACPError) as info:
        await _add_resource(client, namespace, path, name="probe")
    assert info.value.code == "INVALID_PARAMS"
    assert info.value.details["field"] == "spec.path"
    return info.value


async def test_a_namespace_reaches_only_its_own_root(
    server: ACPClient, roots: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    await _add_resource(server, "team-a", roots / "team-a" / "repo")
    (roots / "team-a" / "link").symlink_to(roots / "team-b" / "repo")
    refusals = [
        await _refusal(server, "team-a", roots / "team-b" / "repo"),
        await _refusal(server, "team-a", "/etc"),
        await _refusal(server, "team-a", "/no/such/folder/anywhere"),
        await _refusal(server, "team-a", roots / "team-a" / "link"),
        await _refusal(server, "team-a", roots / "team-a" / ".." / "team-b" / "repo"),
    ]
    # The answer is the same whether the outside path exists or not: nothing to probe.
    assert len({r.message for r in refusals}) == 1
    assert "not an existing directory" not in refusals[0].message
    missing = await _refusal(server, "team-a", roots / "team-a" / "nothing-here")
    assert "not an existing directory" in missing.message


async def test_server_mode_without_roots_says_how_to_configure_them(tmp_path: pathlib.Path) -> None:
    facade = open_facade(tmp_path / "acp.db", policy=Policy.server())
    client = ACPClient(LocalTransport(facade))
    try:
        refused = await _refusal(client, "default", tmp_path)
        assert "--resource-root" in refused.message
    finally:
        await client.close()
        await facade.close()


async def test_resources_outside_the_roots_are_refused_at_use(
    tmp_path: pathlib.Path, roots: pathlib.Path
) -> None:
    """Registered before the roots were configured: plans and context refuse them."""
    outside = tmp_path / "outside"
    write_tree(outside, {"secret.txt": b"do not read\n"})
    facade = open_facade(tmp_path / "acp.db", policy=Policy.local({}))
    client = ACPClient(LocalTransport(facade))
    try:
        await _add_resource(client, "default", outside)
        await client.call("project.add", name="proj", spec={"resources": ["repo"]})
        await add_action(client, steps=[{"tool": "fs.write", "args": {"path": "x.txt", "content": "x"}}])
    finally:
        await client.close()
        await facade.close()
    facade = open_facade(tmp_path / "acp.db", policy=Policy.server([str(roots)]))
    client = ACPClient(LocalTransport(facade))
    try:
        with pytest.raises(ACPError) as info:
            await use(client, {})
        assert info.value.code == "INVALID_PARAMS"
        assert "outside the server's resource roots" in info.value.message
        with pytest.raises(ACPError) as inspect:
            await client.call("context.inspect", item_id="file:repo/secret.txt", project="proj")
        assert "do not read" not in str(inspect.value.details)
        assert not (outside / "x.txt").exists()
    finally:
        await client.close()
        await facade.close()


def test_placeholders_and_relative_roots_are_refused() -> None:
    with pytest.raises(ValueError, match="absolute"):
        Policy.server(["srv/acp"])
    with pytest.raises(ValueError, match="placeholder"):
        Policy.server(["/srv/{user}"])
    policy = Policy.server(["/srv/{namespace}"])
    assert policy.roots("..") == ()
    assert policy.roots("a/b") == ()
    assert policy.roots("team-a") == ("/srv/team-a",)


# commands -----------------------------------------------------------------------------


async def _commands_world(client: ACPClient, project: pathlib.Path, marker: pathlib.Path) -> None:
    await client.call("resource.add", name="repo", spec={"type": "directory", "path": str(project)})
    await client.call("project.add", name="proj", spec={"resources": ["repo"]})
    touch = [PY, "-c", f"open({str(marker)!r}, 'w').write('ran')"]
    await add_command_tool(client, "touch", touch)
    await client.call("validation.add", name="probe", spec={"command": {"argv": touch}})


async def test_a_command_validation_needs_a_profile_allowing_it(tmp_path: pathlib.Path) -> None:
    """Finding 2: the validation ran with no automation profile at all."""
    project, marker = tmp_path / "repo", tmp_path / "marker"
    project.mkdir()
    facade = open_facade(tmp_path / "acp.db", policy=Policy.local({}))
    client = ACPClient(LocalTransport(facade))
    try:
        await _commands_world(client, project, marker)
        await add_action(
            client,
            steps=[{"tool": "fs.write", "args": {"path": "a.txt", "content": "a"}}],
            validations=["probe"],
        )
        plan = await run(client, (await use(client, {})).meta.id)
        assert plan.state == plan_pb2.PLAN_STATE_FAILED
        assert "allowed_validations" in plan.last_error.message
        assert not marker.exists()
        await add_profile(client, "checks", allowed_validations=["probe"])
        # Given at plan.use, the profile cannot widen the action's (it has none).
        widened = await run(client, (await use(client, {}, automation_profile="checks")).meta.id)
        assert widened.state == plan_pb2.PLAN_STATE_FAILED
        assert not marker.exists()
        await add_action(
            client,
            name="checked",
            steps=[{"tool": "fs.write", "args": {"path": "a.txt", "content": "a"}}],
            validations=["probe"],
            profile="checks",
        )
        allowed = await run(client, (await use(client, {}, action="checked")).meta.id)
        assert allowed.state == plan_pb2.PLAN_STATE_SUCCEEDED
        assert marker.read_text() == "ran"
    finally:
        await client.close()
        await facade.close()


async def test_server_mode_runs_no_command_unless_the_operator_allows(
    tmp_path: pathlib.Path, roots: pathlib.Path
) -> None:
    project, marker = roots / "team-a" / "repo", tmp_path / "marker"
    facade = open_facade(tmp_path / "acp.db", policy=Policy.server([str(roots)]))
    client = ACPClient(LocalTransport(facade))
    try:
        await _commands_world(client, project, marker)
        await add_profile(client, "all", allowed_tools=["touch"], allowed_validations=["probe"])
        await add_action(client, steps=[{"tool": "touch", "args": {}}], profile="all")
        plan = await run(client, (await use(client, {})).meta.id)
        assert plan.state == plan_pb2.PLAN_STATE_FAILED
        assert plan.last_error.code == "commands_disabled"
        assert "--allow-commands" in plan.last_error.message
        await add_action(
            client,
            name="validated",
            steps=[{"tool": "fs.write", "args": {"path": "a.txt", "content": "a"}}],
            validations=["probe"],
            profile="all",
        )
        checked = await run(client, (await use(client, {}, action="validated")).meta.id)
        assert checked.state == plan_pb2.PLAN_STATE_FAILED
        assert "--allow-commands" in checked.last_error.message
        assert not marker.exists()
    finally:
        await client.close()
        await facade.close()


def test_settings_and_policy_of_agents_serve() -> None:
    from cleveragents.acp.facade.factory import server_policy

    with pytest.raises(ValueError, match="--command-user"):
        server_policy([], allow_commands=True, command_user=None, euid=0)
    with pytest.raises(ValueError, match="no user"):
        server_policy([], allow_commands=True, command_user="no-such-user-here", euid=0)
    with pytest.raises(ValueError, match="root"):
        server_policy([], allow_commands=True, command_user="root", euid=0)
    policy = server_policy(["/srv/{namespace}"], allow_commands=True, command_user="nobody", euid=0)
    assert policy.command_user is not None
    assert policy.command_user.uid != 0
    assert not server_policy([], allow_commands=False, command_user=None, euid=1000).allow_commands
    assert json.dumps(policy.resource_roots) == '["/srv/{namespace}"]'


async def test_a_root_is_a_folder_not_a_prefix_of_names(tmp_path: pathlib.Path) -> None:
    """Root ``…/team`` holds ``…/team/x``, never its neighbour ``…/team-evil`` (whose name
    starts with the root's), nor the neighbour of a per-namespace root."""
    base = tmp_path / "roots"
    for folder in ("team/repo", "team-evil/repo", "teamx/repo", "a/team/repo", "a/team-evil/repo"):
        (base / folder).mkdir(parents=True)
    for index, roots in enumerate(([f"{base}/team"], [f"{base}/a/{{namespace}}"], [f"{base}/team/"])):
        facade = open_facade(tmp_path / f"acp-{index}.db", policy=Policy.server(roots))
        client = ACPClient(LocalTransport(facade))
        try:
            inside = base / ("a/team/repo" if "{namespace}" in roots[0] else "team/repo")
            await _add_resource(client, "team", inside)
            for neighbour in ("team-evil/repo", "teamx/repo", "a/team-evil/repo", "team-evil", "a/team-evil"):
                refused = await _refusal(client, "team", base / neighbour)
                assert "inside the server's resource roots" in refused.message
        finally:
            await client.close()
            await facade.close()
    policy = Policy.server([f"{base}/team"])
    assert policy.allows_folder("team", f"{base}/team")
    assert policy.allows_folder("team", f"{base}/team/repo")
    assert not policy.allows_folder("team", f"{base}/team-evil")
    assert not policy.allows_folder("team", f"{base}/teamx/repo")
