"""Server subprocesses: start one, wait for its ready line, read its CPU time and memory.

Every server of the benchmark (the product's and the raw baselines) runs in a process of
its own and prints one ``<prefix> {json}`` line once it listens on its ephemeral ports.
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (all its threads) so far."""
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    # The command name may hold spaces; fields after it are space separated.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it now (``agents serve --workers``: the parent and its
    workers), from each thread's ``/proc/<pid>/task/<tid>/children``."""
    found = [pid]
    for children in pathlib.Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            listed = children.read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
        for child in listed:
            found += process_tree(int(child))
    return found


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class ServerProcess:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        ready_prefix: str,
        log: pathlib.Path,
        env: dict[str, str] | None = None,
        cwd: pathlib.Path | None = None,
        timeout: float = 30,
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self._stderr = log.open("w")
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
        self.lines: list[str] = []
        self._ready: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(ready_prefix,), daemon=True)
        self._reader.start()
        try:
            line = self._ready.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise RuntimeError(f"{self.argv[:4]} did not get ready in {timeout} s; see {log}") from None
        if not line:
            self.stop()
            raise RuntimeError(f"{self.argv[:4]} exited during start-up: {log.read_text()[-2000:]}")
        self.info: dict[str, Any] = json.loads(line[len(ready_prefix) :])

    def _read(self, prefix: str) -> None:
        assert self.proc.stdout is not None
        announced = False
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if not announced and line.startswith(prefix):
                announced = True
                self._ready.put(line.strip())
        if not announced:
            self._ready.put("")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def stop(self, timeout: float = 15) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._stderr.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


class CPUMeter:
    """Server CPU spent between ``start`` and ``stop``, per request served meanwhile: user plus
    system time from ``/proc/<pid>/stat`` of the server process and of every process below it
    (a ``--workers`` server's workers), the same processes read at both ends."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.pids: list[int] = []
        self._each: list[float] = []
        self._wall = 0.0
        self.cpu = 0.0
        self.wall = 0.0
        # Each process's share of ``cpu``, in the order of ``pids``.
        self.shares: list[float] = []

    def start(self) -> None:
        self.pids = process_tree(self.server.pid)
        self._each = [cpu_seconds(pid) for pid in self.pids]
        self._wall = time.monotonic()

    def stop(self) -> None:
        each = [cpu_seconds(pid) - before for pid, before in zip(self.pids, self._each, strict=True)]
        self.cpu = sum(each)
        self.shares = [spent / self.cpu if self.cpu else 0.0 for spent in each]
        self.wall = time.monotonic() - self._wall

    def us_per(self, count: int) -> float:
        return self.cpu / count * 1e6 if count else 0.0
