"""Resident memory of a process, split into what it owns and what is mapped page cache.

A memory-mapped index shows up in RSS as file pages ("RssFile"): page cache the kernel may evict and reread,
shared with every process mapping the same file. "RssAnon" is the process's own heap, which is what an
in-RAM index grows. Both are reported because RSS alone cannot tell the two apart.
"""

from __future__ import annotations

import os

RSS_MB = "rss_mb"
ANON_MB = "anon_mb"
FILE_MB = "file_mb"


def process_memory(pid: int | None = None) -> dict[str, float]:
    """``{rss_mb, anon_mb, file_mb}`` of ``pid`` (default: this process) from ``/proc/PID/status``.

    Off Linux only ``rss_mb`` is known (psutil); the split is reported as None.
    """
    status = f"/proc/{pid or os.getpid()}/status"
    try:
        with open(status) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        import psutil

        return {RSS_MB: psutil.Process(pid).memory_info().rss / 2**20, ANON_MB: None, FILE_MB: None}

    def mb(key: str) -> float:
        return int(fields[key].split()[0]) / 1024  # values are in kB

    return {RSS_MB: mb("VmRSS"), ANON_MB: mb("RssAnon"), FILE_MB: mb("RssFile") + mb("RssShmem")}
