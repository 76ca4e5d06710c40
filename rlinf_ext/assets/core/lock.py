"""The asset builders' file lock, with a note of who holds it: a process that has to wait says who it waits for,
what that process is building and for how long, instead of waiting silently."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HOLDER_SUFFIX = ".holder"  # beside the lock file: {pid, host, building, since}


def holder_path(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + HOLDER_SUFFIX)


def describe_holder(note: dict | None, now: float) -> str:
    """``note`` (the holder's JSON) in words (pure)."""
    if not note:
        return "a process that has not said what it builds yet"
    since = float(note.get("since", now))
    return (
        f"pid {note.get('pid', '?')} on {note.get('host', '?')}, building {note.get('building', '?')} "
        f"for {max(0.0, now - since):.0f} s"
    )


def _read_note(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def held_lock(lock_path: Path, building: str) -> Iterator[None]:
    """``lock_path`` held exclusively for the block, with a holder note saying ``building``; a wait for another
    holder is announced on stderr (who, what, since when) and its end too."""
    lock_path = Path(lock_path)
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            started = time.time()
            print(
                f"[assets] waiting for the lock {lock_path}, held by "
                f"{describe_holder(_read_note(holder_path(lock_path)), started)} "
                "(a second build of the same assets would redo that work)",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            print(f"[assets] got the lock {lock_path} after {time.time() - started:.0f} s", file=sys.stderr, flush=True)
        note = holder_path(lock_path)
        tmp = note.with_name(f".{note.name}.{os.getpid()}")
        tmp.write_text(
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "building": building, "since": time.time()})
        )
        os.replace(tmp, note)
        yield
