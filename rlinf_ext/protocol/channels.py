"""Named queues on one RLinf ``Channel``, and the names of the queues a training step uses.

Every ``Channel.create`` starts its own ``ChannelWorker`` process (seconds of start-up each on a small CPU
machine); RLinf channels already hold one sub-queue per key, so the runner creates a single channel and hands
each stage a ``KeyedChannel`` view with the ``put``/``get`` signature of a channel.

The names are RLinf's (its ``AgentRunner`` creates channels with them): prompts flow DataLoader -> agent loop ->
Rollout -> reward -> Reward -> actor log-probs -> Inference -> actor training; GenerateInput/GenerateOutput carry
``protocol.generation.GenerateRequest`` / ``GenerateReply`` between the agent loop and the rollout engines. Each
training batch has its own DataLoader and Rollout sub-queue (``batch_key``); under ``runner.admission: group`` the
finished groups of all batches share one (``STREAM``) and each step's admitted groups get another (``admitted_key``).
"""

from __future__ import annotations

from typing import Any

DATALOADER = "DataLoader"
GENERATE_INPUT = "GenerateInput"
GENERATE_OUTPUT = "GenerateOutput"
ROLLOUT = "Rollout"
REWARD = "Reward"
INFERENCE = "Inference"
STEP_CHANNELS = (DATALOADER, GENERATE_INPUT, GENERATE_OUTPUT, ROLLOUT, REWARD, INFERENCE)


def batch_key(batch: int, refill: int = 0) -> str:
    """The sub-queue of training batch ``batch`` on the DataLoader and Rollout queues: with batches dispatched ahead
    (``runner.max_staleness``) several are in flight, and a stage must never read another batch's items. A dynamic
    sampling step's ``refill``-th extra batch has its own."""
    return f"b{batch}" if refill == 0 else f"b{batch}r{refill}"


STREAM = "stream"  # runner.admission=group: the Rollout sub-queue every batch in flight puts its finished groups on


def admitted_key(step: int) -> str:
    """The Rollout sub-queue where group admission puts the groups step ``step`` trains, for its reward call."""
    return f"a{step}"


HELD = "held"  # the Reward queue's sub-queue where a dynamic-sampling step's scored groups wait for its selection


class KeyedChannel:
    """``put``/``get`` on sub-queue ``name`` (and ``name/key`` when a key is given) of ``channel``."""

    def __init__(self, channel: Any, name: str):
        self.channel = channel
        self.name = name

    def _key(self, key: Any) -> str:
        return self.name if key is None else f"{self.name}/{key}"

    def put(self, item: Any, weight: int = 0, key: Any = None, async_op: bool = False):
        return self.channel.put(item, weight=weight, key=self._key(key), async_op=async_op)

    def get(self, key: Any = None, async_op: bool = False):
        return self.channel.get(key=self._key(key), async_op=async_op)

    def sub(self, key: Any) -> "KeyedChannel":
        """The view of sub-queue ``name/key``: a stage of its own, e.g. one batch's requests and results."""
        return KeyedChannel(self.channel, self._key(key))

    def __repr__(self) -> str:
        return f"KeyedChannel({self.name!r})"
