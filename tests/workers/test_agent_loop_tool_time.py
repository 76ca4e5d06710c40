"""``tool_time`` of ``AgentLoopWorker.run_agentloop_rollout`` (the trainer's ``time/tool``): with
``runner.max_staleness`` >= 1 several requests (batches) run at once on one worker, and each must be charged the
tool calls its own trajectories made, never those of the batches in flight beside it.

The worker is the real class without Ray (``__new__``: only what the method reads); the agent is a stand-in that
holds every group of both requests at two barriers, so that both requests are open while all the calls are made
and none returns before all are done: the widest overlap two batches can have."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from channel_fakes import Channel

from rlinf_ext.agent.core.rollout import AgentRollout
from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.protocol.payloads import AgentRolloutRequest
from rlinf_ext.tools.config import SearchToolConfig
from rlinf_ext.tools.image_search import ImageSearch
from rlinf_ext.tools.search import SearchTool, TextSearch
from rlinf_ext.workers.agent_loop import AgentLoopWorker
from rlinf_ext.workers.returns import AgentLoopOutput
from tests.support.latency_tool import Lookup
from tests.support.signature_checks import checked_against


class BarrierAgent:
    """An ``AgentRollout`` whose task is the list of calls one group makes; ``call(item)`` makes one call and
    returns the latency it reported. All groups of all requests meet at ``start`` before their first call and at
    ``end`` after their last."""

    def __init__(self, tools, call, groups_in_all: int):
        self.tools, self.call = tools, call
        self.start, self.end = asyncio.Barrier(groups_in_all), asyncio.Barrier(groups_in_all)
        self.latencies: dict[str, list[float]] = {}  # uid -> the latencies its calls reported

    @checked_against(AgentRollout.groups)
    def groups(self, request):
        return list(zip(request.tasks, request.uids))

    @checked_against(AgentRollout.run_group)
    async def run_group(self, generator, task, group_size, uid):
        await self.start.wait()
        for item in task:
            self.latencies.setdefault(uid, []).append(await self.call(item))
        await self.end.wait()
        trajectory = SimpleNamespace(metrics={self.tools[0].metric_names().calls: float(len(task))})
        return SimpleNamespace(uid=uid), [trajectory] * group_size

    @checked_against(AgentRollout.metrics)
    def metrics(self, trajectories):
        return {}

    @checked_against(AgentRollout.records)
    def records(self, result):
        return []


def worker_with(agent) -> AgentLoopWorker:
    worker = AgentLoopWorker.__new__(AgentLoopWorker)  # no Ray actor: only what run_agentloop_rollout reads
    worker._timer_metrics = {}  # RLinf's Worker.worker_timer adds to it
    worker.agent = agent
    worker.cfg = SimpleNamespace(runner=SimpleNamespace(admission="batch"))  # each request's groups together
    worker.generate_input_channel, worker.generate_output_channel = Channel(), Channel()
    return worker


def request(tasks: list, batch: str) -> Channel:
    """A channel holding one request of ``tasks`` (one group each, group size 1)."""
    channel = Channel()
    uids = [f"{batch}-{i}" for i in range(len(tasks))]
    channel.queue.put_nowait(
        AgentRolloutRequest(
            n=1,
            input_ids=[[1]] * len(tasks),
            image_data=[[]] * len(tasks),
            answers=[["x"]] * len(tasks),
            multi_modal_inputs=[None] * len(tasks),
            uids=uids,
            seed=0,
            tasks=tasks,
        )
    )
    return channel


async def two_batches(worker, tasks_a: list, tasks_b: list) -> tuple[AgentLoopOutput, AgentLoopOutput]:
    """Both requests on the worker at once, as RLinf's async actor runs two calls of one method."""
    return tuple(
        await asyncio.gather(
            worker.run_agentloop_rollout(request(tasks_a, "a"), Channel()),
            worker.run_agentloop_rollout(request(tasks_b, "b"), Channel()),
        )
    )


def test_each_batch_in_flight_is_charged_only_its_own_tool_calls():
    lookup = Lookup()

    async def call(latency: str):
        return (await lookup.run(latency)).latency_s

    worker = worker_with(BarrierAgent([lookup], call, groups_in_all=3))
    out_a, out_b = asyncio.run(two_batches(worker, [["0.25", "0.5"]], [["1.0"], ["2.0"]]))
    assert out_a.tool_time == 0.75  # 0.25 + 0.5: batch a's group only
    assert out_b.tool_time == 3.0  # 1.0 + 2.0: batch b's two groups
    assert (out_a.tool_calls, out_b.tool_calls) == (2, 2)


def test_the_mmsearch_raw_searches_of_both_tools_are_charged_to_their_batch():
    """MMSearch-R1's loop calls ``TextSearch.search`` directly and ``ImageSearch`` through ``Tool.run``; its
    ``tools`` lists only the text search. Each batch is charged the latencies its own results report."""
    text = TextSearch(SearchTool(SearchToolConfig(backend="dummy", topk=2)))
    image = ImageSearch(
        ImageSearchToolConfig(backend="dummy", topk=2, thumbnail_min_pixels=3136, thumbnail_max_pixels=3136)
    )

    async def call(item: tuple[str, str]):
        kind, query = item
        found = await (image.run(query) if kind == "image" else text.search(query))
        return found.latency_s

    agent = BarrierAgent([text], call, groups_in_all=2)
    worker = worker_with(agent)
    out_a, out_b = asyncio.run(
        two_batches(
            worker, [[("image", "q-1"), ("text", "eiffel")]], [[("text", "louvre"), ("image", "q-2"), ("image", "q-3")]]
        )
    )
    assert out_a.tool_time == sum(agent.latencies["a-0"])
    assert out_b.tool_time == sum(agent.latencies["b-0"])
    assert min(agent.latencies["a-0"] + agent.latencies["b-0"]) > 0.0  # every call took measurable time
