"""Whether anyone committed to a SQLite file since a given moment, read without a syscall.

A WAL database keeps a header in its ``-shm`` file (https://sqlite.org/walformat.html,
"The WAL-Index Header"): every writer, in this process or another, rewrites it at each
commit before the commit returns (``iChange`` counts commits; ``mxFrame``, the frame
checksums and the salts say what the WAL holds). Two equal looks at it mean no commit came
between them. The file is mapped read-only once, so a look is a copy of 96 bytes of shared
memory under the GIL: the event loop may make it, where it may not wait for a statement.

The writer writes the second copy of the header, then the first; a reader reads the first,
then the second, and trusts them only when they are equal (as SQLite's own readers do).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pathlib

# Two copies of the 48-byte WalIndexHdr at the start of the -shm file.
_HEADER = 48
# Byte 12 of a copy: isInit, 0 until a connection has built the index.
_IS_INIT = 12


class WalIndex:
    """The read-only mapping of one database's WAL-index header.

    Map it only while this process keeps a connection to the file open in WAL mode: that
    connection's lock on the ``-shm`` file is what stops any other from truncating it
    (SQLite truncates it only when it is the file's sole user), which would make a look at
    the mapping fault."""

    def __init__(self, database: pathlib.Path) -> None:
        self._map: mmap.mmap | None = None
        path = database.with_name(database.name + "-shm")
        with contextlib.suppress(OSError, ValueError):
            fd = os.open(path, os.O_RDONLY)
            try:
                if os.fstat(fd).st_size >= 2 * _HEADER:
                    self._map = mmap.mmap(fd, 2 * _HEADER, access=mmap.ACCESS_READ)
            finally:
                os.close(fd)

    def state(self) -> bytes | None:
        """The header as it is now, or None when it cannot be read consistently (being
        written, not built yet, no ``-shm`` file: a VFS keeping the index in memory)."""
        mapped = self._map
        if mapped is None:
            return None
        try:
            first = mapped[:_HEADER]
            second = mapped[_HEADER : 2 * _HEADER]
        except ValueError:  # closed by the store meanwhile
            return None
        if first != second or not first[_IS_INIT]:
            return None
        return first

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
