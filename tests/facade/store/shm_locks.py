"""Who holds SQLite's shared lock on a database's ``-shm`` file, read from ``/proc/locks``.

Every process with the database open in WAL mode share-locks the "dead man switch" byte
of ``-shm`` (SQLite's unix VFS: ``UNIX_SHM_DMS`` = 120 + ``SQLITE_SHM_NLOCK``); a process
opening the file that finds no such lock believes it is alone and truncates ``-shm``."""

from __future__ import annotations

import os
import pathlib

DMS = 128


def shm_read_lockers(database: pathlib.Path) -> set[int]:
    """The processes holding a POSIX read lock over the ``-shm`` file's DMS byte."""
    inode = os.stat(f"{database}-shm").st_ino
    lockers = set()
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            # "1: POSIX  ADVISORY  READ 745 08:01:1234 128 128"
            if fields[1] != "POSIX" or fields[3] != "READ" or not fields[5].endswith(f":{inode}"):
                continue
            end = fields[7]
            if int(fields[6]) <= DMS and (end == "EOF" or int(end) >= DMS):
                lockers.add(int(fields[4]))
    return lockers
