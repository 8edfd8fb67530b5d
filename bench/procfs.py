"""What /proc says of a process: its established TCP connections to a port (Redis's), and a field
of its status. Used by ``bench_capacity.py`` and by the capacity tests."""

from __future__ import annotations

import os
from pathlib import Path


def connections_to(pid: int, port: int) -> int:
    """The process's established TCP connections to ``port``: its sockets, matched in /proc/net."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
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
