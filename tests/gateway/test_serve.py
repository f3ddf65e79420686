"""``agents serve`` and ``agents gateway`` as processes: first start, refusals, TLS, CORS,
gateway-only mode and graceful shutdown."""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import ssl
import stat
import subprocess
import threading

import grpc
import httpx
import orjson
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.retry import RetryPolicy
from tests import needs
from tests.gateway.conftest import Served
from tests.gateway.test_http import data_of, envelope, error_of
from tests.server_process import (
    Children,
    Tokens,
    agents_command,
    run_agents,
    start_gateway,
    start_server,
    wait_ready,
)
from tests.tls import make_certificate


def agents(
    *args: str, cwd: pathlib.Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agents_command(*args),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_first_start_prints_a_token_and_a_working_curl_line(
    tmp_path: pathlib.Path, workers: str, children: Children
) -> None:
    state = tmp_path / ".acp"
    args = ["serve", "--state-dir", str(state), "--http-port", "0", "--grpc-port", "0", "--workers", workers]
    server = children.server(wait_ready(run_agents(args, tmp_path), tmp_path / "server.stderr"))
    try:
        output = "\n".join(server.stdout)
        curl_line = next(line.strip() for line in server.stdout if line.strip().startswith("curl "))
        token = next(line.strip() for line in server.stdout if line.strip().startswith("acp_"))
        assert server.grpc is not None
        assert server.grpc in output
        assert server.http in output
        needs.program("curl")
        answer = subprocess.run(
            curl_line, shell=True, capture_output=True, text=True, timeout=15, check=False
        )
        assert orjson.loads(answer.stdout)["status"] == "ok", answer
    finally:
        assert server.stop() == 0, server.stderr()
    tokens = (state / "tokens.toml").read_text()
    assert token not in tokens
    assert "token_sha256" in tokens
    assert stat.S_IMODE((state / "tokens.toml").stat().st_mode) == 0o600
    assert (state / "acp.db").exists()

    again = children.server(wait_ready(run_agents(args, tmp_path, name="again"), tmp_path / "again.stderr"))
    try:
        output = "\n".join(again.stdout)
        assert "acp_" not in output
        assert str(state / "tokens.toml") in output
        assert "agents token create" in output
    finally:
        assert again.stop() == 0, again.stderr()


def test_token_commands(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.toml"
    made = agents(
        "token",
        "create",
        "--tokens",
        str(path),
        "--name",
        "ci",
        "--namespace",
        "a",
        "--namespace",
        "b",
        cwd=tmp_path,
    )
    assert made.returncode == 0
    assert made.stdout.startswith("acp_")
    assert made.stdout.strip() not in path.read_text()
    twice = agents("token", "create", "--tokens", str(path), "--name", "ci", "--all-namespaces", cwd=tmp_path)
    assert twice.returncode == 1
    assert "already exists" in twice.stderr
    agents(
        "token", "create", "--name", "admin", "--all-namespaces", cwd=tmp_path, env={"ACP_TOKENS": str(path)}
    )
    listed = agents("token", "list", "--tokens", str(path), cwd=tmp_path)
    assert listed.stdout.splitlines() == ["ci\ta,b\twriter\texpires=never", "admin\t*\twriter\texpires=never"]
    bad = agents(
        "token", "create", "--tokens", str(path), "--name", "no spaces", "--namespace", "a", cwd=tmp_path
    )
    assert bad.returncode == 1


def test_refusals(tmp_path: pathlib.Path) -> None:
    tokens = Tokens.create(tmp_path)
    base = ["serve", "--tokens", str(tokens.path), "--db", str(tmp_path / "x.db")]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        http_taken = agents(*base, "--http-port", port, "--grpc-port", "0", cwd=tmp_path)
        assert http_taken.returncode == 2
        assert "cannot listen for HTTP" in http_taken.stderr
        grpc_taken = agents(*base, "--http-port", "0", "--grpc-port", port, cwd=tmp_path)
        assert grpc_taken.returncode == 2
        assert "cannot listen for gRPC" in grpc_taken.stderr
    exposed = agents(*base, "--host", "0.0.0.0", "--http-port", "0", "--grpc-port", "0", cwd=tmp_path)
    assert exposed.returncode == 2
    assert "--insecure" in exposed.stderr
    by_env = agents(*base, "--http-port", "0", "--grpc-port", "0", cwd=tmp_path, env={"ACP_HOST": "0.0.0.0"})
    assert by_env.returncode == 2
    assert "not a loopback" in by_env.stderr
    no_tokens = agents(
        "serve", "--http-port", "0", "--grpc-port", "0", "--db", str(tmp_path / "y.db"), cwd=tmp_path
    )
    assert no_tokens.returncode == 2
    assert "token file" in no_tokens.stderr
    half_tls = agents(*base, "--tls-cert", str(tokens.path), cwd=tmp_path)
    assert half_tls.returncode == 2
    assert "--tls-key" in half_tls.stderr
    bad_port = agents(*base, cwd=tmp_path, env={"ACP_HTTP_PORT": "eighty"})
    assert bad_port.returncode == 2
    assert "http_port" in bad_port.stderr
    assert "$ACP_HTTP_PORT" in bad_port.stderr


@pytest.fixture
def certificate(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    return make_certificate(tmp_path)


async def _grpc_over_tls(target: str, root_certificates: bytes) -> None:
    transport = GrpcTransport.connect(target, root_certificates=root_certificates, timeout=10)
    async with ACPClient(transport) as client:
        version = await client.call("meta.version")
        assert list(version.supported_versions) == ["1.3", "1.2", "1.1"]  # type: ignore[attr-defined]
        with pytest.raises(ACPError) as info:
            await client.call("session.list")
        assert info.value.code == "AUTH_REQUIRED"
    # One attempt: the default policy retried the refused handshake for its 20 s deadline.
    plaintext = GrpcTransport(
        grpc.aio.insecure_channel(target), owns_channel=True, timeout=5, retry=RetryPolicy.OFF
    )
    async with ACPClient(plaintext) as client:
        with pytest.raises(ACPError) as info:
            await client.call("meta.version")
        assert info.value.details["grpc_code"] == "UNAVAILABLE"


def test_tls_and_cors(
    tmp_path: pathlib.Path, certificate: tuple[pathlib.Path, pathlib.Path], children: Children
) -> None:
    cert, key = certificate
    tokens = Tokens.create(tmp_path)
    extra = ["--tls-cert", str(cert), "--tls-key", str(key), "--cors-origin", "https://app.example"]
    server = children.server(start_server(tmp_path, *extra, tokens=tokens.path, name="tls"))
    try:
        assert server.http.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=server.http, verify=context, timeout=10) as client:
            assert data_of(envelope(client, {"operation": "meta.version"}))["current_version"] == "1.3"
            error_of(envelope(client, {"operation": "session.list"}), "AUTH_REQUIRED")
            preflight = client.options(
                "/api/v1/acp",
                headers={
                    "Origin": "https://app.example",
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization,content-type",
                },
            )
            assert preflight.headers["access-control-allow-origin"] == "https://app.example"
            assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
            other = client.options(
                "/api/v1/acp",
                headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
            )
            assert "access-control-allow-origin" not in other.headers
        with pytest.raises(httpx.HTTPError), httpx.Client(timeout=5) as plain:
            plain.get(server.http.replace("https://", "http://") + "/api/v1/version")
        asyncio.run(_grpc_over_tls(server.grpc_target, cert.read_bytes()))
    finally:
        assert server.stop() == 0, server.stderr()


def test_gateway_only_mode(tmp_path: pathlib.Path, served: Served, children: Children) -> None:
    gateway = children.server(start_gateway(tmp_path, served.server.grpc_target))
    try:
        assert gateway.grpc is None
        assert "warning" not in gateway.stderr()
        assert not any("NOT REACHABLE" in line for line in gateway.stdout)
        with httpx.Client(base_url=gateway.http, timeout=10) as client:
            version = client.get("/api/v1/version", headers={"X-Request-ID": "through-gw"})
            assert data_of(version)["supported_versions"] == ["1.3", "1.2", "1.1"]
            assert version.json()["request_id"] == "through-gw"
            assert data_of(client.get("/healthz")) == {"status": "SERVING"}
            error_of(envelope(client, {"operation": "session.list"}), "AUTH_REQUIRED")
            error_of(envelope(client, {"operation": "session.list"}, "acp_bogus"), "AUTH_REQUIRED")
            created = data_of(envelope(client, {"operation": "session.create"}, served.token()))
            show = {"operation": "session.show", "params": {"session_id": created["session"]["meta"]["id"]}}
            # Another namespace's session answers as an unknown id, naming no namespace.
            refused = error_of(envelope(client, show, served.token("bob")), "NOT_FOUND")
            assert refused["refinement"] == "SESSION_NOT_FOUND"
            assert "namespace" not in refused
            error_of(
                envelope(client, {"operation": "meta.version", "acp_version": "1.0"}), "VERSION_MISMATCH"
            )
            error_of(envelope(client, {"operation": "plan.fly"}), "NOT_FOUND")
            error_of(envelope(client, {"operation": "session.show"}, served.token()), "INVALID_PARAMS")
            error_of(client.get("/api/v1/events/stream"), "AUTH_REQUIRED")
            auth = {"Authorization": f"Bearer {served.token()}"}
            with client.stream("GET", "/api/v1/events/stream", headers=auth) as stream:
                assert stream.status_code == 200
                lines = stream.iter_lines()
                assert next(lines) == ": stream open"
                # A server shutting down ends its open streams cleanly.
                stopper = threading.Thread(target=gateway.stop)
                stopper.start()
                rest = list(lines)
                stopper.join(20)
            assert all(line == "" or line.startswith((":", "id:", "event:", "data:")) for line in rest)
        assert gateway.process.returncode == 0, gateway.stderr()
    finally:
        if gateway.process.poll() is None:
            gateway.stop()


def test_gateway_without_upstream_answers_envelopes(tmp_path: pathlib.Path, children: Children) -> None:
    """An upstream on a closed port: the gateway tries it once (no "attempts" in the answer;
    it used to retry six times, about six seconds), says nothing was sent and that another
    try may get through, and a client's own retry policy does the retrying."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    gateway = children.server(start_gateway(tmp_path, f"127.0.0.1:{port}"))
    try:
        # It starts (the upstream may come later) but says at once that it cannot reach it.
        assert f"  upstream 127.0.0.1:{port}   (NOT REACHABLE now)" in gateway.stdout
        assert (
            f"agents gateway: warning: the upstream 127.0.0.1:{port} cannot be reached (" in gateway.stderr()
        )
        with httpx.Client(base_url=gateway.http, timeout=30) as client:
            for answer in (
                client.get("/api/v1/version"),
                envelope(client, {"operation": "session.show", "params": {"session_id": "01A"}}),
            ):
                details = error_of(answer, "INTERNAL_ERROR")
                assert details == {"grpc_code": "UNAVAILABLE", "sent": False, "retryable": True}

        async def retried_by_the_client() -> ACPError:
            retry = RetryPolicy(attempts=2, backoff=0)
            acp = ACPClient(HTTPTransport.connect(gateway.http, retry=retry))
            try:
                with pytest.raises(ACPError) as info:
                    await acp.call("session.create", title="never sent")
            finally:
                await acp.close()
            return info.value

        error = asyncio.run(retried_by_the_client())
        assert error.code == "INTERNAL_ERROR"
        assert error.details["grpc_code"] == "UNAVAILABLE"
        assert error.details["attempts"] == 2
    finally:
        assert gateway.stop() == 0, gateway.stderr()
