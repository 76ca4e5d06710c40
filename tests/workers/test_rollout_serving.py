"""The rollout workers' pause in wait mode (``WeightGate``) and the versions a sync gives, pure asyncio."""

from __future__ import annotations

import asyncio

import pytest

from rlinf_ext.sync.weight_sync import WeightSyncError
from rlinf_ext.workers.rollout_serving import INITIAL_WEIGHT_VERSION, WeightGate, next_weight_version


def test_the_drivers_version_or_one_more():
    assert next_weight_version(INITIAL_WEIGHT_VERSION, None) == 1
    assert next_weight_version(4, None) == 5
    assert next_weight_version(4, 9) == 9 and next_weight_version(4, 0) == 0  # the driver's word, even backwards


def test_a_pause_waits_for_the_turns_in_flight_and_holds_new_ones_back():
    events: list[str] = []

    async def go():
        gate = WeightGate()
        release = asyncio.Event()

        async def turn(name, hold=None):
            async with gate.turn(name) as version:
                events.append(f"{name} starts v{version}")
                if hold is not None:
                    await hold.wait()
            events.append(f"{name} ends")

        running = asyncio.create_task(turn("a", release))
        await asyncio.sleep(0)
        pause = asyncio.create_task(gate.pause("test engine"))
        await asyncio.sleep(0.01)
        assert not pause.done() and gate.paused and gate.in_flight == 1  # "a" still runs: the pause waits
        waiting = asyncio.create_task(turn("b"))
        await asyncio.sleep(0.01)
        assert gate.in_flight == 1  # "b" is not admitted while the gate is closed
        release.set()
        await pause
        events.append("load")
        gate.resume(3)
        await asyncio.gather(running, waiting)
        return gate

    gate = asyncio.run(go())
    assert events == ["a starts v0", "a ends", "load", "b starts v3", "b ends"]
    assert gate.version == 3 and gate.in_flight == 0 and not gate.paused


def test_a_broken_sync_resumes_on_the_old_version():
    async def go():
        gate = WeightGate(version=2)
        await gate.pause("test engine")  # nothing in flight: returns at once
        gate.resume(None)
        async with gate.turn("k") as version:
            return version, gate.in_flight

    assert asyncio.run(go()) == (2, 1)


def test_a_turn_that_fails_leaves_the_gate_idle():
    async def go():
        gate = WeightGate()
        with pytest.raises(ValueError):
            async with gate.turn("k"):
                raise ValueError("engine error")
        await asyncio.wait_for(gate.pause("test engine"), 1.0)
        return gate.in_flight

    assert asyncio.run(go()) == 0


def test_a_pause_that_outlasts_its_timeout_names_the_engine_and_the_stuck_requests():
    """A generate that hangs would hold the sync (and the run) forever: the pause gives up after its timeout with
    the engine and the channel keys of the requests still in flight; a request that finished is not named."""

    async def go():
        gate = WeightGate()
        hang, done = asyncio.Event(), asyncio.Event()

        async def turn(key, hold):
            async with gate.turn(key):
                await hold.wait()

        stuck = asyncio.create_task(turn("uid-stuck", hang))
        finished = asyncio.create_task(turn("uid-done", done))
        await asyncio.sleep(0)
        done.set()
        await finished
        with pytest.raises(WeightSyncError) as raised:
            await gate.pause("HF rollout rank 3", timeout_s=0.05)
        assert gate.paused  # the caller reopens the gate (the sync's finally), as after any broken sync
        gate.resume(None)
        hang.set()
        await stuck
        return str(raised.value), gate.in_flight

    message, in_flight = asyncio.run(go())
    assert "HF rollout rank 3" in message and "0.05 s" in message, message
    assert "uid-stuck" in message and "uid-done" not in message, message
    assert in_flight == 0
