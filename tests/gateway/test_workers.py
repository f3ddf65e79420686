"""``agents serve --workers 2`` and two servers on one file, as real processes: every event any
process commits reaches every subscriber of every process in order; resume works on any
process; a stream ticket issued by one is redeemed by another; a killed worker is started
again; ``kill -9`` of the whole group loses nothing acknowledged.

Which worker takes a connection is the kernel's choice (SO_REUSEPORT): the tests open fresh
connections until each worker's own metrics listener (``--metrics-port`` P, P+1) shows it
served some, so "on each worker" is checked, not hoped for."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cleveragents.acp.facade.domain.events import tickets
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2
from tests.gateway.test_http import envelope, error_of
from tests.gateway.test_sse import STREAM, Frames, new_session, stream, tell
from tests.gateway.test_tickets import ticket_for
from tests.server_process import ServerProcess, Tokens, agents_command, kill_group, start_server

TIMEOUT = 30.0
# Fresh connections tried before giving up on reaching both workers (each lands on a given
# worker with probability 1/2: 60 misses in a row do not happen).
MAX_TRIES = 60


def free_port_pair() -> int:
    """A port P with P+1 free too (for the two workers' metrics listeners)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise AssertionError("no two consecutive free ports")


@contextlib.contextmanager
def running(server: ServerProcess) -> Iterator[ServerProcess]:
    """Stops the server (and, if it will not stop, kills its process group) at the end."""
    try:
        yield server
    finally:
        if server.process.poll() is None:
            try:
                assert server.stop() == 0, server.stderr()
            finally:
                kill_group(server.process)
        else:
            kill_group(server.process)
            if server.process.stdout is not None:
                server.process.stdout.close()


@pytest.fixture
def tokens(tmp_path: pathlib.Path) -> Tokens:
    return Tokens.create(tmp_path)


@pytest.fixture
def metrics_port() -> int:
    return free_port_pair()


@pytest.fixture
def workers(tmp_path: pathlib.Path, tokens: Tokens, metrics_port: int) -> Iterator[ServerProcess]:
    server = start_server(tmp_path, "--workers", "2", "--metrics-port", str(metrics_port), tokens=tokens.path)
    with running(server):
        yield server


def ready_info(server: ServerProcess) -> dict[str, object]:
    line = next(line for line in server.stdout if line.startswith("acp-ready "))
    info: dict[str, object] = json.loads(line.removeprefix("acp-ready "))
    return info


def fresh(server: ServerProcess) -> httpx.Client:
    """A client whose every request opens a new connection (so lands on any worker)."""
    return httpx.Client(base_url=server.http, timeout=10, limits=httpx.Limits(max_keepalive_connections=0))


def metric(port: int, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples of one worker's metrics whose labels include ``labels``."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def per_worker(metrics_port: int, name: str, **labels: str) -> list[float]:
    return [metric(metrics_port + index, name, **labels) for index in range(2)]


def test_events_from_every_worker_reach_every_subscriber_in_order(
    workers: ServerProcess, tokens: Tokens, metrics_port: int
) -> None:
    token = tokens.tokens["alice"]
    with fresh(workers) as client, contextlib.ExitStack() as streams:
        session_id = new_session(client, token)
        readers: list[Frames] = []
        for _ in range(MAX_TRIES):
            response = streams.enter_context(
                client.stream("GET", STREAM, headers={"Authorization": f"Bearer {token}"})
            )
            assert response.status_code == 200
            readers.append(Frames(response))
            if len(readers) >= 3 and min(per_worker(metrics_port, "acp_event_stream_subscribers")) >= 1:
                break
        assert min(per_worker(metrics_port, "acp_event_stream_subscribers")) >= 1
        told = 0
        for _ in range(MAX_TRIES):
            for _ in range(5):
                tell(client, token, session_id, f"message {told}")
                told += 1
            tells = per_worker(metrics_port, "acp_requests_total", operation="session.tell")
            if min(tells) >= 3:
                break
        assert min(per_worker(metrics_port, "acp_requests_total", operation="session.tell")) >= 3
        for reader in readers:
            assert user_messages(reader, told) == [f"message {index}" for index in range(told)]


def user_messages(reader: Frames, count: int) -> list[str]:
    """The next ``count`` user messages of a stream, checking every frame's id follows the
    one before (no gap, no duplicate, whichever worker committed it)."""
    ids: list[int] = []
    texts: list[str] = []
    while len(texts) < count:
        frame = reader.next(TIMEOUT)
        ids.append(int(frame.id or 0))
        message = json.loads(frame.data).get("session_message", {}).get("message", {})
        if message.get("role") == "MESSAGE_ROLE_USER":
            texts.append(message["content"])
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    return texts


def test_resume_works_on_whichever_worker_a_client_reconnects_to(
    workers: ServerProcess, tokens: Tokens, metrics_port: int
) -> None:
    token = tokens.tokens["alice"]
    headers = {"Authorization": f"Bearer {token}"}
    with fresh(workers) as client:
        session_id = new_session(client, token)
        last = 0
        told: list[str] = []
        seen: list[str] = []
        for attempt in range(MAX_TRIES):
            for index in range(2):
                told.append(f"m{attempt}.{index}")
                tell(client, token, session_id, told[-1])
            with client.stream("GET", STREAM, headers={**headers, "Last-Event-ID": str(last)}) as response:
                assert response.status_code == 200
                reader = Frames(response)
                while len(seen) < len(told):
                    frame = reader.next(TIMEOUT)
                    assert int(frame.id or 0) == last + 1
                    last += 1
                    message = json.loads(frame.data).get("session_message", {}).get("message", {})
                    if message.get("role") == "MESSAGE_ROLE_USER":
                        seen.append(message["content"])
            if attempt >= 2 and min(per_worker(metrics_port, "acp_subscribers_ended_total")) >= 2:
                break
        assert min(per_worker(metrics_port, "acp_subscribers_ended_total")) >= 2
        assert seen == told


def test_the_stream_ticket_cap_holds_across_workers(
    workers: ServerProcess, tokens: Tokens, metrics_port: int
) -> None:
    """A principal's tickets asked over fresh connections (so of both workers): the cap is the
    server's, not each worker's. Both workers issued some, each refuses the next, and a ticket
    used on either frees one place for both."""
    token = tokens.tokens["alice"]
    asked = {"operation": "events.ticket", "params": {}}
    with fresh(workers) as client:
        held = [ticket_for(client, token) for _ in range(tickets.MAX_PER_PRINCIPAL)]
        at_cap = per_worker(metrics_port, "acp_requests_total", operation="events.ticket")
        assert min(at_cap) >= 1
        for _ in range(MAX_TRIES):
            refused = error_of(envelope(client, asked, token), "BUDGET_EXCEEDED")
            assert refused["refinement"] == "TOO_MANY_TICKETS"
            now = per_worker(metrics_port, "acp_requests_total", operation="events.ticket")
            if all(after > before for after, before in zip(now, at_cap, strict=True)):
                break
        assert all(
            after > before
            for after, before in zip(
                per_worker(metrics_port, "acp_requests_total", operation="events.ticket"), at_cap, strict=True
            )
        )
        with client.stream("GET", STREAM, params={"ticket": held[0]}) as opened:
            assert opened.status_code == 200
        ticket_for(client, token)
        refused = error_of(envelope(client, asked, token), "BUDGET_EXCEEDED")
        assert refused["refinement"] == "TOO_MANY_TICKETS"


def restarted_worker(server: ServerProcess) -> dict[str, int]:
    """The ``acp-worker`` line of a worker the parent started again (waited for, bounded)."""
    deadline = time.monotonic() + TIMEOUT * 2
    while time.monotonic() < deadline:
        lines = [line for line in list(server.stdout) if line.startswith("acp-worker ")]
        if lines:
            restarted: dict[str, int] = json.loads(lines[-1].removeprefix("acp-worker "))
            return restarted
        time.sleep(0.1)
    raise AssertionError(f"no worker was started again: {server.stderr()}")


def test_a_killed_worker_is_started_again(workers: ServerProcess, tokens: Tokens, metrics_port: int) -> None:
    token = tokens.tokens["alice"]
    pids = ready_info(workers)["workers"]
    assert isinstance(pids, list)
    victim = int(pids[0])
    started = metric(metrics_port, "process_start_time_seconds")
    os.kill(victim, signal.SIGKILL)
    restarted = restarted_worker(workers)
    assert restarted["index"] == 0
    assert restarted["pid"] != victim
    assert "worker 0" in workers.stderr()
    # The new worker 0 serves its metrics port again, and every call succeeds.
    assert metric(metrics_port, "process_start_time_seconds") > started
    with fresh(workers) as client:
        session_id = new_session(client, token)
        for index in range(20):
            tell(client, token, session_id, f"after {index}")


def test_kill_9_of_the_whole_group_loses_nothing_acknowledged(tmp_path: pathlib.Path, tokens: Tokens) -> None:
    server = start_server(tmp_path, "--workers", "2", tokens=tokens.path)
    token = tokens.tokens["alice"]
    acknowledged: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    with running(server):
        with fresh(server) as client:
            session_ids = [new_session(client, token) for _ in range(4)]

        def write(session_id: str) -> None:
            with fresh(server) as client:
                for index in range(10_000):
                    if stop.is_set():
                        return
                    text = f"{session_id} {index}"
                    try:
                        tell(client, token, session_id, text)
                    except (httpx.HTTPError, AssertionError):
                        return
                    with lock:
                        acknowledged.append(text)

        threads = [threading.Thread(target=write, args=(sid,), daemon=True) for sid in session_ids]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + TIMEOUT * 2
        while len(acknowledged) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_group(server.process)
        stop.set()
        for thread in threads:
            thread.join(TIMEOUT)
    assert len(acknowledged) >= 40
    store = SQLiteStore(tmp_path / "server.db")
    try:
        stored = store.read_events(0, 1_000_000)
    finally:
        store.close()
    assert [event.sequence for event in stored] == list(range(1, len(stored) + 1))
    texts = {events_pb2.Event.FromString(event.body).session_message.message.content for event in stored}
    assert set(acknowledged) <= texts


def test_two_servers_on_one_file_share_events_resume_and_tickets(
    tmp_path: pathlib.Path, tokens: Tokens
) -> None:
    """Each client picks its process here: writes through both, a subscriber on each, a resume
    on the other one, and a ticket issued by one redeemed by the other (then used up for both)."""
    token = tokens.tokens["alice"]
    db = str(tmp_path / "shared.db")
    with (
        running(start_server(tmp_path, "--db", db, tokens=tokens.path, name="a")) as first,
        running(start_server(tmp_path, "--db", db, tokens=tokens.path, name="b")) as second,
        httpx.Client(base_url=first.http, timeout=10) as on_first,
        httpx.Client(base_url=second.http, timeout=10) as on_second,
    ):
        session_id = new_session(on_first, token)
        told = [f"m{index}" for index in range(12)]
        with stream(on_first, token) as reader_a, stream(on_second, token) as reader_b:
            for index, text in enumerate(told):
                tell(on_first if index % 2 == 0 else on_second, token, session_id, text)
            assert user_messages(reader_a, len(told)) == told
            assert user_messages(reader_b, len(told)) == told
        with stream(on_second, token, headers={"Last-Event-ID": "3"}) as resumed:
            assert int(resumed.next(TIMEOUT).id or 0) == 4
        ticket = ticket_for(on_first, token, session_id=session_id)
        query = {"ticket": ticket, "session_id": session_id}
        with on_second.stream("GET", STREAM, params=query) as response:
            assert response.status_code == 200
            assert int(Frames(response).next(TIMEOUT).id or 0) == 1
        with on_first.stream("GET", STREAM, params=query) as reused:
            reused.read()
            assert error_of(reused, "AUTH_REQUIRED")["refinement"] == "TICKET_USED"


@pytest.mark.parametrize("which", ["--grpc-port", "--http-port"])
def test_a_port_another_reuseport_server_holds_is_refused_not_joined(
    tmp_path: pathlib.Path, tokens: Tokens, which: str
) -> None:
    """A leftover server of the same user listening with SO_REUSEPORT would share its traffic
    if the workers joined it: the parent checks the port without SO_REUSEPORT first."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ports = {"--grpc-port": "0", "--http-port": "0", which: port}
        args = ["serve", "--workers", "2", "--host", "127.0.0.1", "--db", str(tmp_path / "acp.db")]
        args += ["--tokens", str(tokens.path)]
        for flag, value in ports.items():
            args += [flag, value]
        done = run_agents_to_end(args)
    assert done.returncode == 2, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("agents serve: cannot listen for "), lines
    assert f":{port}" in lines[0]


@pytest.mark.parametrize("count", ["0", "65", "two"])
def test_a_bad_worker_count_is_refused(tmp_path: pathlib.Path, tokens: Tokens, count: str) -> None:
    done = run_agents_to_end(["serve", "--workers", count, "--tokens", str(tokens.path), "--http-port", "0"])
    assert done.returncode == 2, done
    assert "--workers" in done.stderr


def run_agents_to_end(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agents_command(*args),
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("ACP_")},
    )
