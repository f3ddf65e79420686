"""The product's server (``agents serve``) in a subprocess, with a token and a client."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Sequence

from bench.procs import ServerProcess
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.facade import auth

READY = "acp-ready "


def agents_command() -> list[str]:
    script = pathlib.Path(sys.executable).parent / "agents"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "cleveragents.acp.client.cli.main"]


class Product:
    """``agents serve`` on ephemeral loopback ports over a fresh SQLite file (or ``db``: a
    file, or a ``postgresql://`` URL)."""

    def __init__(
        self,
        folder: pathlib.Path,
        *,
        db: pathlib.Path | str | None = None,
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        role: str = "writer",
    ) -> None:
        """``extra``: more ``agents serve`` flags; ``env``: its environment on top of ours;
        ``role``: the bench principal's (admin to register command tools)."""
        folder.mkdir(parents=True, exist_ok=True)
        tokens = folder / "tokens.toml"
        self.token = auth.create_token(tokens, "bench", ["default"], role=role)
        self.db = db or folder / "acp.db"
        argv = [*agents_command(), "serve", "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0"]
        argv += ["--db", str(self.db), "--tokens", str(tokens), "--log-level", "warning"]
        # The benchmarks' projects are folders under this one: the server's only resource root.
        argv += ["--resource-root", str(folder), *extra]
        self.server = ServerProcess(argv, ready_prefix=READY, log=folder / "server.log", env=env)
        self.http_url: str = self.server.info["http"]
        self.grpc_target: str = self.server.info["grpc"]

    def client(self) -> ACPClient:
        """A gRPC client for setting things up (not for measuring)."""
        return ACPClient(GrpcTransport.connect(self.grpc_target, timeout=30), token=self.token)

    @property
    def auth_header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> Product:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
