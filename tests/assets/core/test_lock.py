"""The asset builders' lock says who holds it: a second builder waiting on it names the holder's pid, host, what it
builds and for how long, then says when it got the lock (the new user waited 7 minutes in silence)."""

from __future__ import annotations

import json
import os
import threading
import time

from rlinf_ext.assets.core.lock import describe_holder, held_lock, holder_path


def test_the_holder_is_described_in_words():
    note = {"pid": 42, "host": "node3", "building": "base + registry (seed 0)", "since": 100.0}
    assert describe_holder(note, 130.4) == "pid 42 on node3, building base + registry (seed 0) for 30 s"
    assert describe_holder(None, 1.0) == "a process that has not said what it builds yet"


def test_a_waiter_names_the_holder_and_what_it_builds(tmp_path, capsys):
    lock = tmp_path / "entry.lock"
    holding, release = threading.Event(), threading.Event()

    def holder():
        with held_lock(lock, "base + mm sft (seed 0) for entry"):
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(10)
    note = json.loads(holder_path(lock).read_text())
    assert note["pid"] == os.getpid() and note["building"] == "base + mm sft (seed 0) for entry"
    threading.Timer(0.3, release.set).start()
    started = time.monotonic()
    with held_lock(lock, "base (seed 0) for entry"):
        waited = time.monotonic() - started
        assert json.loads(holder_path(lock).read_text())["building"] == "base (seed 0) for entry"
    thread.join(10)
    err = capsys.readouterr().err
    assert waited >= 0.2
    assert f"waiting for the lock {lock}, held by pid {os.getpid()} on " in err
    assert "building base + mm sft (seed 0) for entry for 0 s" in err and f"got the lock {lock} after" in err


def test_an_uncontended_lock_says_nothing(tmp_path, capsys):
    with held_lock(tmp_path / "x.lock", "base"):
        pass
    assert capsys.readouterr().err == ""
