"""What /proc says of a process: its established TCP connections to a port (Redis's), a field of its
status, and its children. Used by ``bench_capacity.py``, ``bench_scale.py`` and the capacity tests."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def connections_to(pid: int | Iterable[int], port: int) -> int:
    """The established TCP connections to ``port`` of a process (or of several together): their
    sockets, matched in /proc/net."""
    inodes = set()
    for one in [pid] if isinstance(pid, int) else pid:
        try:
            fds = list(Path(f"/proc/{one}/fd").iterdir())
        except OSError:  # gone meanwhile
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == "01" and fields[9] in inodes:  # 01: established
                count += 1
    return count


def status(pid: int, field: str) -> int:
    """A numeric field of /proc/<pid>/status (``Threads``, ``VmRSS``, ``VmHWM`` in KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    """The process's child processes (a prefork worker's pool), as /proc lists them now."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:  # gone meanwhile
        pass
    return found
