"""Whether anyone committed to a SQLite file since a given moment, read without a syscall.

A WAL database keeps a header in its ``-shm`` file (https://sqlite.org/walformat.html,
"The WAL-Index Header"): every writer, in this process or another, rewrites it at each
commit before the commit returns (``iChange`` counts commits; ``mxFrame``, the frame
checksums and the salts say what the WAL holds). Two equal looks at it mean no commit came
between them. The file is mapped read-only once, so a look is a copy of 96 bytes of shared
memory under the GIL: the event loop may make it, where it may not wait for a statement.

The writer writes the second copy of the header, then the first; a reader reads the first,
then the second, and trusts them only when they are equal (as SQLite's own readers do).

Closing ANY descriptor of a file releases every POSIX lock the process holds on it (fcntl
semantics), SQLite's own included: its shared lock on ``-shm`` is what tells a process
opening the database (an ``sqlite3`` shell, a backup, a restarted worker) that it is not
alone; one that believes it is truncates ``-shm`` under every mapping of it, and the next
look faults (SIGBUS). So the descriptor is never closed while SQLite may hold locks: one
per file per process, shared by every index on it, and closed with the last of them (a
store closes its index after its own connections).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pathlib
import threading

# Two copies of the 48-byte WalIndexHdr at the start of the -shm file.
_HEADER = 48
# Byte 12 of a copy: isInit, 0 until a connection has built the index.
_IS_INIT = 12


class _Held:
    """One ``-shm`` file held open by this process: its descriptors (a second one only if
    the file was replaced between a stat and an open) and its mapping, if it could map one."""

    def __init__(self, fd: int, mapped: mmap.mmap | None) -> None:
        self.fds = [fd]
        self.map = mapped
        self.users = 1


# By (device, inode): the -shm files this process holds, and how many indexes use each.
_held: dict[tuple[int, int], _Held] = {}
_held_lock = threading.Lock()


def _hold(path: pathlib.Path) -> tuple[tuple[int, int], _Held] | None:
    """The process's hold on the file at ``path`` (taken now or shared); None when there is
    no such file. No descriptor of a file already held is ever opened and closed again."""
    with _held_lock:
        try:
            status = os.stat(path)
        except OSError:
            return None
        key = (status.st_dev, status.st_ino)
        held = _held.get(key)
        if held is not None:
            held.users += 1
            return key, held
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        opened = os.fstat(fd)
        key = (opened.st_dev, opened.st_ino)
        held = _held.get(key)
        if held is not None:  # replaced since the stat, by one this process holds already
            held.fds.append(fd)
            held.users += 1
            return key, held
        mapped = None
        if opened.st_size >= 2 * _HEADER:
            with contextlib.suppress(OSError, ValueError):
                mapped = mmap.mmap(fd, 2 * _HEADER, access=mmap.ACCESS_READ)
        held = _held[key] = _Held(fd, mapped)
        return key, held


def _release(key: tuple[int, int]) -> None:
    with _held_lock:
        held = _held[key]
        held.users -= 1
        if held.users:
            return
        del _held[key]
        if held.map is not None:
            held.map.close()
        for fd in held.fds:
            os.close(fd)


class WalIndex:
    """The read-only mapping of one database's WAL-index header.

    Open it only while this process keeps a connection to the file open in WAL mode, and
    close it after that connection: the connection's lock on the ``-shm`` file is what
    stops any other process from truncating it (SQLite truncates it only when it is the
    file's sole user), and the held descriptor is what keeps that lock."""

    def __init__(self, database: pathlib.Path) -> None:
        self._key: tuple[int, int] | None = None
        self._map: mmap.mmap | None = None
        held = _hold(database.with_name(database.name + "-shm"))
        if held is not None:
            self._key, shared = held
            self._map = shared.map

    def state(self) -> bytes | None:
        """The header as it is now, or None when it cannot be read consistently (being
        written, not built yet, no ``-shm`` file: a VFS keeping the index in memory)."""
        mapped = self._map
        if mapped is None:
            return None
        try:
            first = mapped[:_HEADER]
            second = mapped[_HEADER : 2 * _HEADER]
        except ValueError:  # closed meanwhile
            return None
        if first != second or not first[_IS_INIT]:
            return None
        return first

    def close(self) -> None:
        key, self._key, self._map = self._key, None, None
        if key is not None:
            _release(key)
