"""Batches dispatched ahead (``runner.max_staleness``) put two ``run_agentloop_rollout`` calls on the same
agent-loop worker at once: RLinf's WorkerGroup over the real ``AgentLoopWorker`` (an async actor) must run them
concurrently, each on its own DataLoader/Rollout sub-queue. The test is the rollout engine: it reads the generate
requests of both batches before it answers any (one call at a time could not send batch 1's requests before batch
0 had its replies), then answers batch 1 first. A stop's drain cancels such calls and the worker serves on."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from trainer_helpers import kill_groups, make_cfg

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # slow: a Ray worker

PROMPTS = {0: [101, 102, 103], 1: [201, 202, 203]}
GROUP = 2
ANSWER = "<answer> paris </answer>"


def read(channel, count: int, seconds: float) -> list:
    """``count`` items from ``channel``, or what came within ``seconds``."""
    got: list = []

    def take():
        for _ in range(count):
            got.append(channel.get())

    reader = threading.Thread(target=take, daemon=True)
    reader.start()
    reader.join(seconds)
    return got


@dataclass
class AgentLoop:
    """One launched agent-loop worker group and the step channels it was initialised with."""

    cfg: Any
    group: Any
    q: dict

    def dispatch(self, b: int, results_key: str | None = None):
        """Batch ``b``'s one-prompt request on its own sub-queues (``results_key``: another Rollout sub-queue);
        the call's handle."""
        from rlinf_ext.protocol import channels as ch
        from rlinf_ext.protocol.payloads import AgentRolloutRequest

        requests = self.q[ch.DATALOADER].sub(ch.batch_key(b))
        results = self.q[ch.ROLLOUT].sub(results_key or ch.batch_key(b))
        requests.put(
            AgentRolloutRequest(
                n=GROUP,
                input_ids=[PROMPTS[b]],
                image_data=[[]],
                answers=[["paris"]],
                multi_modal_inputs=[None],
                uids=[f"s{b}-0000-q"],
                seed=b,
                tasks=[],
            )
        )
        return self.group.run_agentloop_rollout(requests, results)


@pytest.fixture(scope="module")
def agent_loops(tiny_assets, tmp_path_factory, module_cluster):
    """``agent_loops(admission)``: the module's agent-loop worker for ``runner.admission`` (launched on first use,
    ~10 s on a busy box, so the tests of one admission share it: a worker serves on after each test's calls)."""
    from rlinf.scheduler import Channel

    from rlinf_ext.protocol import channels as ch
    from rlinf_ext.protocol.channels import KeyedChannel
    from rlinf_ext.runner.groups import WorkerGroups, cpu_strategy
    from rlinf_ext.workers.agent_loop import AgentLoopWorker

    launched: dict[str, AgentLoop] = {}

    def get(admission: str) -> AgentLoop:
        if admission not in launched:
            name = f"AgentLoop{admission.capitalize()}"  # a group and channel of this module's own
            cfg = make_cfg(
                tiny_assets,
                tmp_path_factory.mktemp(name),
                "http://127.0.0.1:9",
                **{"algorithm.group_size": GROUP, "runner.admission": admission},
            )
            group = AgentLoopWorker.create_group(cfg, search_server_addr="127.0.0.1:9").launch(
                module_cluster, placement_strategy=cpu_strategy(1), name=name
            )
            channel = Channel.create(f"{name.lower()}-channel")
            q = {key: KeyedChannel(channel, key) for key in ch.STEP_CHANNELS}
            launched[admission] = AgentLoop(cfg, group, q)
            group.init_worker(q[ch.GENERATE_INPUT], q[ch.GENERATE_OUTPUT]).wait()
        return launched[admission]

    try:
        yield get
    finally:
        for loop in launched.values():
            kill_groups(WorkerGroups(rollout=None, actor=None, reward=None, agent_loop=loop.group, placement=None))


@pytest.fixture
def agent_loop(agent_loops, request):
    return agent_loops(getattr(request, "param", "batch"))  # runner.admission, for the test that asks for it


def answer(q, by_batch: dict, ids: list[int]) -> None:
    from rlinf_ext.protocol import channels as ch

    for b in (1, 0):  # the later batch is answered first
        for request in by_batch[b]:
            reply = {
                "output_ids": ids,
                "text": ANSWER,
                "finish_reason": "stop",
                "matched_stop": "</answer>",
                "logprobs": None,
                "num_generated": len(ids),
            }
            q[ch.GENERATE_OUTPUT].put(reply, key=request["channel_key"])


@pytest.mark.parametrize("agent_loop", ["group"], indirect=True)
def test_group_admission_gets_each_finished_group_on_the_shared_stream_with_its_own_records(agent_loop):
    """``runner.admission: group``: both batches put their groups on the one Rollout stream, as they finish, each
    with the group's own records and trajectory count (what a step admitting it reports)."""
    from transformers import AutoTokenizer

    from rlinf_ext.protocol import channels as ch

    q = agent_loop.q
    handles = {b: agent_loop.dispatch(b, ch.STREAM) for b in PROMPTS}
    generate = read(q[ch.GENERATE_INPUT], 2 * GROUP, seconds=120)
    by_batch = {b: [r for r in generate if r["prompt_ids"][:3] == prompt] for b, prompt in PROMPTS.items()}
    answer(q, by_batch, AutoTokenizer.from_pretrained(agent_loop.cfg.rollout.model.model_path).encode(ANSWER))
    finished = read(q[ch.ROLLOUT].sub(ch.STREAM), 2, seconds=60)
    assert sorted(f.result.uid for f in finished) == ["s0-0000-q", "s1-0000-q"]
    for group in finished:
        assert group.output.num_trajectories == GROUP and group.result.num_sequence == GROUP
        assert {t["uid"] for t in group.output.trajectories} == {group.result.uid}
    for b in PROMPTS:
        [out] = handles[b].wait()
        assert out.num_trajectories == GROUP


def test_two_overlapping_rollouts_on_one_agent_loop_worker(agent_loop):
    from transformers import AutoTokenizer

    from rlinf_ext.protocol import channels as ch
    from rlinf_ext.protocol.channels import batch_key

    q = agent_loop.q
    handles = {b: agent_loop.dispatch(b) for b in PROMPTS}
    generate = read(q[ch.GENERATE_INPUT], 2 * GROUP, seconds=120)
    by_batch = {b: [r for r in generate if r["prompt_ids"][:3] == prompt] for b, prompt in PROMPTS.items()}
    assert [len(by_batch[b]) for b in PROMPTS] == [GROUP, GROUP], "the two calls did not run at once"

    ids = AutoTokenizer.from_pretrained(agent_loop.cfg.rollout.model.model_path).encode(ANSWER)
    answer(q, by_batch, ids)
    for b in (1, 0):
        [out] = handles[b].wait()
        assert out.num_trajectories == GROUP
        assert {t["uid"] for t in out.trajectories} == {f"s{b}-0000-q"}
        [result] = read(q[ch.ROLLOUT].sub(batch_key(b)), 1, seconds=30)
        assert result.uid == f"s{b}-0000-q" and result.num_sequence == GROUP


def test_a_discarded_rollout_is_cancelled_at_its_turn_and_the_worker_serves_on(agent_loop):
    """A stop's drain (``runner/groups.py:abort_call``): the agent loop waiting for a reply that never comes ends on
    the cancellation (Ray cancels the async actor's task) within the bound, and the worker takes the next call."""
    from rlinf_ext.protocol import channels as ch
    from rlinf_ext.runner.groups import abort_call, is_cancellation, quiet_worker_failures

    q = agent_loop.q
    rlinf_handler = signal.getsignal(signal.SIGUSR1)
    quiet_worker_failures()  # as the launcher does: RLinf's handler would tear the cluster down at the cancellation
    try:
        handles = [agent_loop.dispatch(b) for b in PROMPTS]
        assert len(read(q[ch.GENERATE_INPUT], 2 * GROUP, seconds=120)) == 2 * GROUP  # both wait for replies
        error = abort_call(handles[0], "agent_loop", "run_agentloop_rollout", timeout_s=30)
        assert error is not None and is_cancellation(error), error
        assert not handles[1].done()  # the other batch is untouched ...
        assert is_cancellation(abort_call(handles[1], "agent_loop", "run_agentloop_rollout", timeout_s=30))
        assert agent_loop.group.init_worker(q[ch.GENERATE_INPUT], q[ch.GENERATE_OUTPUT]).wait() == [None]  # serves on
    finally:
        signal.signal(signal.SIGUSR1, rlinf_handler)
