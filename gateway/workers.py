"""``agents serve --workers N``: N worker processes serving the same HTTP and gRPC ports,
one store and one event log, under a parent that restarts a worker that dies.

The parent checks that both ports are free (a bind without SO_REUSEPORT, so a leftover server
on the port is refused, not joined), then holds each port with a socket bound with
SO_REUSEPORT but not listening: it takes no connections, keeps the port for the workers
(also across a restart) and lets them bind it with SO_REUSEPORT, these two listeners only.
The kernel spreads new connections over the workers. Before any worker starts, the parent
opens the store once (migrations, and the plans a stopped server left are settled), so the
workers start on a settled store.

Each worker is ``python -m cleveragents.acp.gateway.workers SPEC``: the same settings as the
parent (flags, environment, config file) with the ports it chose. Its event follower reads
the events every worker commits (``facade/domain/events/log.py``), woken at once by the others
through Unix datagram sockets in a private folder (``facade/store/wakeups.py``). A plan runs
in the worker that started it (its record names that process as owner); a worker restarted
after a crash settles the plans the dead one left, as a restarted server does.

SIGTERM or SIGINT to the parent drains every worker (each does what one server does on
SIGTERM) and ends when all have; a worker that outlives the grace period is killed. A worker
is told to stop when the parent dies (``PR_SET_PDEATHSIG``). Workers that keep dying at
start-up make the parent give up with exit status 1.

Once the workers are up the parent sleeps until something happens: its signals (SIGCHLD
when a worker exits, SIGTERM, SIGINT) write to a wake-up pipe its selector watches beside
the workers' ready pipes, so an idle server's parent wakes no one (it used to look five
times a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import os
import pathlib
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from cleveragents.acp.facade.factory import WorkerSlot
from cleveragents.acp.gateway import loops, startup
from cleveragents.acp.gateway.server import Addresses, ServeError, Server, ServerConfig, bind_socket
from cleveragents.acp.gateway.settings import ServeSettings

# A worker must be listening within this long of its start.
START_TIMEOUT = 120.0
# After a crash, before the worker is started again.
RESTART_DELAY = 0.5
# A worker dying within QUICK_CRASH seconds of its start, MAX_QUICK_CRASHES times in a row,
# ends the server (it cannot start: a bad file, a port taken by another user).
QUICK_CRASH = 10.0
MAX_QUICK_CRASHES = 5
# Beyond the grace period, how long stopping workers get before they are killed.
STOP_MARGIN = 10.0
_TICK = 0.2
_PR_SET_PDEATHSIG = 1


def reserve(host: str, port: int, what: str) -> socket.socket:
    """Check ``port`` is free (0: pick one) and hold it for the workers: bound with
    SO_REUSEPORT, not listening."""
    probe = bind_socket(host, port)  # refuses a port in use, with ServeError
    chosen = probe.getsockname()[1]
    probe.close()
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), chosen, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    hold = socket.socket(family, kind, proto)
    try:
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        hold.bind(address)
    except OSError as exc:
        hold.close()
        raise ServeError(f"cannot hold the {what} port {chosen} for the workers: {exc.strerror}") from None
    return hold


@dataclasses.dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    ready_fd: int
    started: float
    ready: bool = False
    pending: bytes = b""


class Supervisor:
    def __init__(
        self,
        prepared: startup.Prepared,
        flags: Mapping[str, Any],
        config: pathlib.Path | None,
        http_port: int,
        grpc_port: int,
        directory: pathlib.Path,
    ) -> None:
        self.prepared = prepared
        self.count = prepared.settings.workers
        self.flags = {name: flags.get(name) for name in ServeSettings.model_fields}
        self.config = config
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.directory = directory
        self.workers: list[_Worker] = []
        self.stopping = False
        self.quick_crashes = 0
        # Set when workers kept dying at start-up: the parent exits 1.
        self.failed = False
        # What the banner's example call may use (the parent's settle pass found them).
        self.served: frozenset[str] = frozenset()
        # The token of a --state-dir server's first start, printed once in the banner.
        self.token: str | None = None
        # The ready line is out: a worker ready after this is a restarted one.
        self._announced = False
        self._selector = selectors.DefaultSelector()

    # workers --------------------------------------------------------------------------

    def _spawn(self, index: int) -> _Worker:
        read_fd, write_fd = os.pipe()
        spec = {
            "flags": self.flags,
            "config": str(self.config) if self.config is not None else None,
            "index": index,
            "count": self.count,
            "http_port": self.http_port,
            "grpc_port": self.grpc_port,
            "directory": str(self.directory),
            "ready_fd": write_fd,
        }
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, json.dumps(spec, default=str)], pass_fds=(write_fd,)
            )
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        worker = _Worker(index, process, read_fd, time.monotonic())
        self._selector.register(read_fd, selectors.EVENT_READ, worker)
        return worker

    def _forget(self, worker: _Worker) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(worker.ready_fd)
        with contextlib.suppress(OSError):
            os.close(worker.ready_fd)

    def _read_ready(self, timeout: float | None) -> None:
        """Mark the workers whose ready line arrived (a worker that died before it sends EOF);
        empty the signals' wake-up pipe. ``timeout`` None: until one of them has news."""
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    while os.read(key.fd, 512):
                        pass
                continue
            worker: _Worker = key.data
            try:
                chunk = os.read(worker.ready_fd, 64)
            except BlockingIOError:
                continue
            if not chunk:
                self._forget(worker)
                continue
            worker.pending += chunk
            if b"\n" in worker.pending:
                worker.ready = True
                self._forget(worker)
                if self._announced:
                    # A restarted worker: tests and operators see its new pid.
                    print(
                        f"acp-worker {json.dumps({'index': worker.index, 'pid': worker.process.pid})}",
                        flush=True,
                    )

    # running --------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    @staticmethod
    def _on_child(signum: int, frame: object) -> None:
        """SIGCHLD: its byte on the wake-up pipe is the news; ``_supervise`` looks."""

    def _wake_on_signals(self) -> Callable[[], None]:
        """Signals also write to a pipe the selector watches; returns what undoes it."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        previous_child = signal.signal(signal.SIGCHLD, self._on_child)
        self._selector.register(read_fd, selectors.EVENT_READ, None)

        def undo() -> None:
            signal.signal(signal.SIGCHLD, previous_child)
            signal.set_wakeup_fd(previous_fd)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(read_fd)
            os.close(read_fd)
            os.close(write_fd)

        return undo

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        undo = self._wake_on_signals()
        try:
            self.workers = [self._spawn(index) for index in range(self.count)]
            status = self._start()
            if status == 0:
                self._supervise()
            return status
        finally:
            undo()
            self._stop_all()
            self._selector.close()

    def _start(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT
        while not all(worker.ready for worker in self.workers):
            if self.stopping:
                return 0
            for worker in self.workers:
                if not worker.ready and worker.process.poll() is not None:
                    return startup.fail(
                        "serve",
                        f"worker {worker.index} exited during start-up "
                        f"with status {worker.process.returncode}",
                    )
            if time.monotonic() > deadline:
                return startup.fail("serve", f"the workers did not start within {START_TIMEOUT:.0f} s")
            self._read_ready(_TICK)
        host = self.prepared.config.host
        scheme = "https" if self.prepared.config.tls is not None else "http"
        url_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        addresses = Addresses(f"{scheme}://{url_host}:{self.http_port}", f"{url_host}:{self.grpc_port}")
        print(
            startup.banner(self.prepared, addresses, self.token, self.served, workers=self.count),
            flush=True,
        )
        pids = [worker.process.pid for worker in self.workers]
        print(startup.ready_line(addresses.http_url, addresses.grpc_target, workers=pids), flush=True)
        self._announced = True
        return 0

    def _supervise(self) -> None:
        while not self.stopping:
            # Until a ready line, a signal, or a worker's exit (SIGCHLD) wakes it.
            self._read_ready(None)
            for position, worker in enumerate(self.workers):
                if self.stopping or worker.process.poll() is None:
                    continue
                self._forget(worker)
                lived = time.monotonic() - worker.started
                self.quick_crashes = self.quick_crashes + 1 if lived < QUICK_CRASH else 0
                print(
                    f"agents serve: worker {worker.index} (pid {worker.process.pid}) exited with status "
                    f"{worker.process.returncode}; starting it again",
                    file=sys.stderr,
                    flush=True,
                )
                if self.quick_crashes >= MAX_QUICK_CRASHES:
                    print(
                        f"agents serve: workers died {MAX_QUICK_CRASHES} times in a row within "
                        f"{QUICK_CRASH:.0f} s of starting; stopping",
                        file=sys.stderr,
                        flush=True,
                    )
                    self.stopping = True
                    self.failed = True
                    return
                time.sleep(RESTART_DELAY)
                self.workers[position] = self._spawn(worker.index)

    def _stop_all(self) -> None:
        """SIGTERM to every worker (each drains like one server), then wait; kill leftovers."""
        for worker in self.workers:
            if worker.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.prepared.config.grace_seconds + STOP_MARGIN
        for worker in self.workers:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(5)
            self._forget(worker)


def supervise(prepared: startup.Prepared, flags: Mapping[str, Any], config: pathlib.Path | None) -> int:
    """``agents serve --workers N`` in the parent; the exit code."""
    settings = prepared.settings
    try:
        http_hold = reserve(settings.host, settings.http_port, "HTTP")
    except ServeError as exc:
        return startup.fail("serve", str(exc))
    try:
        grpc_hold = reserve(settings.host, settings.grpc_port, "gRPC")
    except ServeError as exc:
        http_hold.close()
        return startup.fail("serve", str(exc))
    directory = pathlib.Path(tempfile.mkdtemp(prefix="acp-workers-"))
    try:
        token = startup.first_token(prepared)
        served = asyncio.run(_settle(prepared))
        if served is None:
            return 2
        supervisor = Supervisor(
            prepared, flags, config, http_hold.getsockname()[1], grpc_hold.getsockname()[1], directory
        )
        supervisor.served = served
        supervisor.token = token
        status = supervisor.run()
        return 1 if supervisor.failed else status
    finally:
        http_hold.close()
        grpc_hold.close()
        shutil.rmtree(directory, ignore_errors=True)


async def _settle(prepared: startup.Prepared) -> frozenset[str] | None:
    """Open the store once before the workers: migrations run, and the plans a stopped
    server left are settled by one process, not raced by N."""
    try:
        facade = await asyncio.to_thread(prepared.opening(None))
    except ServeError as exc:
        startup.fail("serve", str(exc))
        return None
    try:
        return facade.served_operations
    finally:
        await facade.close()


# the worker process ---------------------------------------------------------------------


def _die_with_parent() -> None:
    """SIGTERM (a drain) when the parent dies, however it dies (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def worker_main(raw: str) -> int:
    spec = json.loads(raw)
    _die_with_parent()
    ready_fd = int(spec["ready_fd"])
    flags = {**spec["flags"], "http_port": spec["http_port"], "grpc_port": spec["grpc_port"]}
    prepared = startup.prepare(flags, pathlib.Path(spec["config"]) if spec["config"] else None)
    if isinstance(prepared, int):
        return prepared
    index = int(spec["index"])
    metrics_port = prepared.config.metrics_port
    config = dataclasses.replace(
        prepared.config,
        reuse_port=True,
        # One metrics listener per worker: scraping a shared port would give any one of them.
        metrics_port=metrics_port + index if metrics_port else metrics_port,
    )
    slot = WorkerSlot(pathlib.Path(spec["directory"]), index, int(spec["count"]))
    # startup.prepare checked the choice (in the parent, and here again).
    return loops.run(_work(prepared, config, slot, ready_fd), loops.resolve(prepared.settings.loop))


async def _work(prepared: startup.Prepared, config: ServerConfig, slot: WorkerSlot, ready_fd: int) -> int:
    server = Server(config, opening=prepared.opening(slot))
    try:
        await server.start()
    except ServeError as exc:
        return startup.fail("serve", f"worker {slot.index}: {exc}")
    server.install_signal_handlers()
    try:
        os.write(ready_fd, f"{os.getpid()}\n".encode())
        os.close(ready_fd)
        await server.wait()
    finally:
        await server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1]))
