"""The batch's dispatch index reaches the engines: ``run_agentloop_rollout`` hands its request's ``priority`` to the
``ChannelGenerator`` its agent generates with, and every generate request on the channel carries it (the rollout
workers pass it to their engine: lower is served first)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from channel_fakes import Channel, KeyedChannel

from rlinf_ext.agent.core.rollout import AgentRollout
from rlinf_ext.protocol.generation import GenerationResult, SamplingParams, reply_of
from rlinf_ext.protocol.payloads import AgentRolloutRequest
from rlinf_ext.workers.agent_loop import AgentLoopWorker, ChannelGenerator
from tests.support.signature_checks import checked_against


class OneTurnAgent:
    """Each group generates one turn through the worker's generator; the generators are kept."""

    tools: list = []

    def __init__(self):
        self.generators: list[ChannelGenerator] = []

    @checked_against(AgentRollout.groups)
    def groups(self, request):
        return list(zip(request.tasks, request.uids))

    @checked_against(AgentRollout.run_group)
    async def run_group(self, generator, task, group_size, uid):
        self.generators.append(generator)
        await generator.generate([1, 2], SamplingParams(max_new_tokens=1))
        return SimpleNamespace(uid=uid), []

    @checked_against(AgentRollout.metrics)
    def metrics(self, trajectories):
        return {}

    @checked_against(AgentRollout.records)
    def records(self, result):
        return []


async def answer(requests: KeyedChannel, replies: KeyedChannel, seen: list) -> None:
    request = await requests.get(async_op=True).async_wait()
    seen.append(request)
    reply = reply_of(GenerationResult(output_ids=[3], text="", finish_reason="length"))
    await replies.put(reply, key=request["channel_key"], async_op=True).async_wait()


def test_a_batch_priority_goes_with_every_generate_request():
    worker = AgentLoopWorker.__new__(AgentLoopWorker)  # no Ray actor: only what run_agentloop_rollout reads
    worker._timer_metrics = {}
    worker.agent = OneTurnAgent()
    worker.cfg = SimpleNamespace(runner=SimpleNamespace(admission="batch"))
    requests, replies = KeyedChannel(), KeyedChannel()
    worker.generate_input_channel, worker.generate_output_channel = requests, replies
    channel = Channel()
    channel.queue.put_nowait(
        AgentRolloutRequest(
            n=1,
            input_ids=[[1]],
            image_data=[[]],
            answers=[["x"]],
            multi_modal_inputs=[None],
            uids=["s3-0"],
            seed=5,
            priority=3,
            tasks=["t"],
        )
    )
    seen: list = []

    async def run():
        await asyncio.gather(worker.run_agentloop_rollout(channel, Channel()), answer(requests, replies, seen))

    asyncio.run(run())
    assert worker.agent.generators[0].priority == 3
    assert seen[0]["priority"] == 3 and seen[0]["prompt_ids"] == [1, 2]
