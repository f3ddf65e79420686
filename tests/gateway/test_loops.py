"""The event loop a server runs on (issue 35): uvloop where installed, asyncio's own when
asked (``--loop``, ``ACP_LOOP``, ``loop`` in the config file), the banner saying which.

``make test`` runs every served test (a subprocess ``agents serve``) on uvloop, the default,
and every in-process test on asyncio's loop; ``make test-loops`` runs the whole suite again
the other way round. Here, in ``make test``, both loops serve every wire, and one contract
scenario runs over every transport with the test's own loop on uvloop.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import urllib.request

import grpc
import pytest

from cleveragents.acp.gateway import loops
from cleveragents.acp.v1 import meta_pb2
from tests.conformance.harness import run_everywhere
from tests.conformance.scenarios import SCENARIOS
from tests.server_process import Children, Tokens, agents_command, start_server


def test_auto_is_uvloop_where_it_is_installed() -> None:
    assert loops.available(), "uvloop is a dependency on this platform (pyproject.toml)"
    assert loops.resolve("auto") == "uvloop"
    assert loops.resolve("uvloop") == "uvloop"
    assert loops.resolve("asyncio") == "asyncio"


def test_each_loop_is_the_one_asked_for() -> None:
    async def which() -> str:
        return loops.running()

    assert loops.run(which(), "uvloop") == "uvloop"
    assert loops.run(which(), "asyncio") == "asyncio"


def version_over_grpc(target: str) -> str:
    with grpc.insecure_channel(target, options=[("grpc.enable_retries", 0)]) as channel:
        call = channel.unary_unary(
            "/cleveragents.acp.v1.MetaService/GetVersion",
            request_serializer=meta_pb2.GetVersionRequest.SerializeToString,
            response_deserializer=meta_pb2.GetVersionResponse.FromString,
        )
        answer: meta_pb2.GetVersionResponse = call(meta_pb2.GetVersionRequest(), timeout=10)
    return answer.current_version


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_server_on_each_loop_serves_both_wires(
    loop: str, tmp_path: pathlib.Path, children: Children
) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, "--loop", loop, tokens=tokens.path))
    assert any(f"on the {loop} event loop" in line for line in server.stdout), server.stdout
    with urllib.request.urlopen(f"{server.http}/api/v1/version", timeout=10) as answer:
        http_version = json.loads(answer.read())["data"]["current_version"]
    assert version_over_grpc(server.grpc_target) == http_version
    assert server.stop() == 0


def test_the_environment_chooses_the_loop_too(tmp_path: pathlib.Path, children: Children) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, tokens=tokens.path, env={"ACP_LOOP": "asyncio"}))
    assert any("on the asyncio event loop" in line for line in server.stdout), server.stdout


def test_a_loop_that_is_no_loop_is_refused_with_its_source(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        agents_command(
            "serve", "--state-dir", str(tmp_path / "state"), "--http-port", "0", "--grpc-port", "0"
        ),
        env={"PATH": "/usr/bin:/bin", "ACP_LOOP": "trio", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "ACP_LOOP" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_contract_scenario_runs_on_uvloop_over_every_transport(tmp_path: pathlib.Path) -> None:
    tokens = Tokens.create(tmp_path / "tokens")

    async def scenario() -> str:
        await run_everywhere(SCENARIOS["sessions"], tmp_path, tokens)
        return loops.running()

    assert loops.run(scenario(), "uvloop") == "uvloop"


async def test_the_suites_own_loop_is_the_one_make_asked_for() -> None:
    """tests/conftest.py gives in-process tests ``$ACP_TEST_LOOP`` (asyncio unless asked)."""
    assert loops.running() == os.environ.get("ACP_TEST_LOOP", "asyncio")
