"""The HF rollout worker's logic on CPU without Ray (``HFRolloutState``): weight versions across a sync that lands while
the agent loop is mid-trajectory. The real parts: the HF engine on a tiny Qwen2, the serving loop, the agent loop's
``ChannelGenerator`` and the Search-R1 loop over RLinf-checked fake channels, and the weight sync's paired route
(shared-memory handle buckets, acknowledgements, ``SYNC_END``, the logits probe); only the transport between the
actor's and the rollout's processes is a fake (``FakeTransport``, bound to RLinf's ``Worker.recv``/``send``)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
import torch
from channel_fakes import KeyedChannel, Op
from rlinf.scheduler import Worker as RLinfWorker

from rlinf_ext.agent.core.response import OBSERVATION_VERSION, check_mask_invariant
from rlinf_ext.agent.core.results import result_from_group
from rlinf_ext.agent.searchr1.config import LoopSettings
from rlinf_ext.agent.searchr1.loop import run_trajectory
from rlinf_ext.protocol.generation import STOP_SERVING, SamplingParams
from rlinf_ext.sync.weight_sync import (
    SYNC_ACK,
    SYNC_END,
    SyncHeader,
    SyncRoutes,
    WeightSyncError,
    pack_buckets,
    prepare_handles,
    share_bucket,
)
from rlinf_ext.workers.agent_loop import ChannelGenerator
from rlinf_ext.workers.rollout_hf import HFRolloutState
from rlinf_ext.workers.rollout_serving import INITIAL_WEIGHT_VERSION
from tests.agent.searchr1.test_loop import RecordingSearch
from tests.support.signature_checks import bind_like

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # slow: two tiny HF models and real generation

CFG = SimpleNamespace(
    actor=SimpleNamespace(group_name="ActorGroup"),
    rollout=SimpleNamespace(group_name="RolloutGroup"),
    runner=SimpleNamespace(partial_rollout=False),
)
DRIVER_VERSION = 7  # the training steps behind the synced weights, as the driver passes them


class FakeTransport(HFRolloutState):
    """What ``receive_weights`` calls on the worker (paired route), each call bound to the installed RLinf ``Worker``
    method; ``log`` records each message taken (shared with the channels' puts: one order of events)."""

    def __init__(self, messages, log):
        self._rank = 0
        self.inbox, self.log = list(messages), log

    def recv(self, group, src, async_op=True):
        bind_like(RLinfWorker.recv, self, group, src, async_op=async_op)
        message = self.inbox.pop(0)
        self.log.append(("recv", type(message).__name__))
        return Op(message)

    def send(self, obj, group, dst, async_op=True):
        bind_like(RLinfWorker.send, self, obj, group, dst, async_op=async_op)
        assert obj == SYNC_ACK
        return Op()


@pytest.fixture(scope="module")
def models(qwen2_head32_pair):
    from transformers import AutoModelForCausalLM

    return [AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval() for d in qwen2_head32_pair]


def sync_messages(model) -> list:
    """One paired-route sync of ``model``'s weights as the actor sends it: header with the probe's logits, handle
    buckets, ``SYNC_END``."""
    prepare_handles(torch.device("cpu"))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    buckets = [share_bucket(b) for b in pack_buckets(state.items(), max_bytes=64 << 10, shared=True)]
    ids = torch.arange(3, 15).reshape(1, -1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return [SyncHeader(version=123, sender=0, probe_ids=ids, probe_logits=logits)] + buckets + [SYNC_END]


def worker(model_dir, new_model, log) -> FakeTransport:
    from rlinf_ext.generation.hf import HFGenerator

    w = FakeTransport(sync_messages(new_model), log)
    w._setup(CFG, verify_sync=True, sync_atol=1e-4)
    w.generator = HFGenerator.from_pretrained(str(model_dir), dtype="float32", max_batch_size=4, return_logprobs=True)
    w.defaults = SamplingParams(max_new_tokens=8, do_sample=False)
    w.sync_routes = SyncRoutes("paired", actor_world=1, rollout_dp=1)
    return w


async def serving(w: FakeTransport, log: list):
    """The worker's serving loop and an agent-loop generator wired by keyed channels (as the runner wires them)."""
    requests, replies = KeyedChannel(log), KeyedChannel(log)
    loop = asyncio.get_running_loop().create_task(w.rollout_serverless(requests, replies))
    return ChannelGenerator(requests, replies, step_seed=0), requests, loop


async def stop(requests: KeyedChannel, loop: asyncio.Task) -> None:
    await requests.put({"channel_key": STOP_SERVING}, async_op=True).async_wait()
    await loop


async def until(condition, what: str, timeout_s: float = 30.0) -> None:
    """Wait for ``condition()``; a clear failure instead of a hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}")
        await asyncio.sleep(0.001)


class SyncAfterFirstTurn:
    """The agent loop's generator; the driver's weight sync lands after the first turn's reply, while the trajectory
    is between its first and second turn (where a tool call would be running)."""

    def __init__(self, inner, sync):
        self.inner, self.sync, self.turns = inner, sync, 0

    async def generate(self, prompt_ids, sampling_params, images=None):
        result = await self.inner.generate(prompt_ids, sampling_params, images)
        self.turns += 1
        if self.turns == 1:
            await self.sync()
        return result


def test_a_sync_between_two_turns_gives_each_turn_its_own_version(qwen2_head32_pair, models):
    """The real Search-R1 loop over the real HF worker: the first turn's tokens carry the initial version, the turns
    after the sync the driver's version, observation tokens -1; the result's versions and behaviour log-probs line
    up with the response ids."""
    from transformers import AutoTokenizer

    log: list = []
    w = worker(qwen2_head32_pair[0], models[1], log)
    tok = AutoTokenizer.from_pretrained(str(qwen2_head32_pair[0]))
    prompt = tok.encode("Question 3: which city is the capital of country 3?", add_special_tokens=False)
    settings = LoopSettings(max_turns=2, response_length_total=200, max_obs_length=40)

    async def go():
        generator, requests, loop = await serving(w, log)
        gen = SyncAfterFirstTurn(generator, lambda: w._receive_and_load(DRIVER_VERSION))
        traj = await run_trajectory(
            gen,
            tok,
            prompt,
            ["city 1"],
            settings,
            [RecordingSearch()],
            sampling_params=SamplingParams(max_new_tokens=8, do_sample=False),
            uid="u",
        )
        await stop(requests, loop)
        return traj

    traj = asyncio.run(go())
    assert len(traj.turns) >= 2, [t.action for t in traj.turns]  # the random model's turns are invalid: a retry follows
    assert [t.weight_version for t in traj.turns] == [INITIAL_WEIGHT_VERSION] + [DRIVER_VERSION] * (len(traj.turns) - 1)
    first = traj.turns[0]
    assert first.observation_ids, "the first turn's observation (mask 0) sits between the two versions"
    expected = []
    for turn in traj.turns:
        expected += [turn.weight_version] * len(turn.response_ids) + [OBSERVATION_VERSION] * len(turn.observation_ids)
    assert traj.rollout_versions == expected
    assert [v for v, m in zip(traj.rollout_versions, traj.response_mask) if not m] == [
        OBSERVATION_VERSION
    ] * traj.response_mask.count(0)
    check_mask_invariant(traj)
    assert w.weight_version == DRIVER_VERSION and w.last_sync_logit_diff < 1e-4  # the new weights, checked

    # the group's result: per-token versions and behaviour log-probs shaped like the response ids
    result = result_from_group([traj, traj])
    assert result.versions == [traj.rollout_versions] * 2
    n = len(traj.response_ids)
    assert tuple(result.rollout_logprobs.shape) == (2, n) and result.response_lengths == [n, n]
    assert torch.equal(result.rollout_logprobs[0], torch.tensor(traj.rollout_logprobs))
    assert all(result.rollout_logprobs[0, i] == 0.0 for i, m in enumerate(traj.response_mask) if not m)


def test_a_sync_waits_for_the_generate_in_flight(qwen2_head32_pair, models):
    """A sync requested while a turn is being generated: the turn finishes on the old weights (its ids are the old
    model's greedy ids, stamped with the old version) before any bucket is taken; a turn asked for during the sync
    waits and is generated by the new weights under the new version."""
    log: list = []
    w = worker(qwen2_head32_pair[0], models[1], log)
    long = SamplingParams(max_new_tokens=24, do_sample=False)
    prompt = [5, 9, 11, 13, 17]
    old_ids = w.generator.generate_batch_sync([prompt], long)[0].output_ids

    async def go():
        generator, requests, loop = await serving(w, log)
        in_flight = asyncio.create_task(generator.generate(prompt, long))
        await until(lambda: w.gate.in_flight, "the turn to be in flight")
        sync = asyncio.create_task(w._receive_and_load(DRIVER_VERSION))
        await until(lambda: w.gate.paused or sync.done(), "the sync to pause the worker")
        assert w.gate.in_flight == 1 and not in_flight.done()  # the pause began with the turn still running
        during = asyncio.create_task(generator.generate(prompt, long))
        first, second = await asyncio.wait_for(in_flight, 60), await asyncio.wait_for(during, 60)
        await asyncio.wait_for(sync, 60)
        await stop(requests, loop)
        return first, second

    first, second = asyncio.run(go())
    assert first.weight_version == INITIAL_WEIGHT_VERSION and first.output_ids == old_ids
    assert second.weight_version == DRIVER_VERSION
    assert second.output_ids == w.generator.generate_batch_sync([prompt], long)[0].output_ids != old_ids
    replies = [i for i, e in enumerate(log) if e[0] == "put" and e[1] != "default_queue"]
    buckets = [i for i, e in enumerate(log) if e == ("recv", "HandleBucket")]
    assert replies[0] < buckets[0] and buckets[-1] < replies[1], log  # old turn, then the load, then the new turn


def test_versions_count_by_one_without_the_drivers_version(qwen2_head32_pair, models):
    log: list = []
    w = worker(qwen2_head32_pair[0], models[1], log)
    assert w.weight_version == INITIAL_WEIGHT_VERSION == 0
    asyncio.run(w._receive_and_load())
    assert w.weight_version == 1 and asyncio.run(w.get_state())["weight_version"] == 1


def test_a_hung_generate_times_the_syncs_pause_out_naming_the_rank_and_the_request(qwen2_head32_pair, models):
    """A generate that hangs (the model's forward blocks: a stuck engine) while a sync lands: the sync's pause gives
    up after the worker's timeout with an error naming this rollout rank and the stuck request's channel key,
    instead of blocking the run silently; the gate reopens on the old version, and the request, once unstuck, is
    answered."""
    log: list = []
    w = worker(qwen2_head32_pair[0], models[1], log)
    w.sync_timeout_s = 0.5
    entered, unstick = threading.Event(), threading.Event()

    def hang(module, args):  # runs in the generator's thread: the engine is stuck until the test lets it go
        entered.set()
        unstick.wait(60)

    hook = w.generator.model.register_forward_pre_hook(hang)

    async def go():
        requests, replies = KeyedChannel(log), KeyedChannel(log)
        loop = asyncio.get_running_loop().create_task(w.rollout_serverless(requests, replies))
        await requests.put(
            {"channel_key": "uid-stuck", "prompt_ids": [5, 9, 11], "sampling_params": {}}, async_op=True
        ).async_wait()
        await until(entered.is_set, "the generate to start")
        try:
            with pytest.raises(WeightSyncError) as raised:
                try:
                    await asyncio.wait_for(w._receive_and_load(DRIVER_VERSION), 10)
                except TimeoutError:
                    raise AssertionError("the sync still waits for the hung generate after 10 s") from None
            reopened = not w.gate.paused
        finally:
            hook.remove()
            unstick.set()
        reply = await asyncio.wait_for(replies.get("uid-stuck", async_op=True).async_wait(), 60)
        await stop(requests, loop)
        return str(raised.value), reopened, reply

    message, reopened, reply = asyncio.run(go())
    assert "rank 0" in message and "uid-stuck" in message and "0.5 s" in message, message
    assert reopened and w.weight_version == INITIAL_WEIGHT_VERSION
    assert "error" not in reply and reply["weight_version"] == INITIAL_WEIGHT_VERSION


class HoldAtToken:
    """A logits processor (scores unchanged) that holds the first generation once it has sampled ``at`` tokens until
    ``release`` is set (``reached`` tells the test it holds): the sync then lands mid-turn, between two decode steps,
    at a known token."""

    def __init__(self, prompt_len: int, at: int, release: threading.Event):
        self.prompt_len, self.at, self.release = prompt_len, at, release
        self.reached = threading.Event()

    def __call__(self, input_ids, scores):
        if not self.reached.is_set() and input_ids.shape[1] - self.prompt_len >= self.at:
            self.reached.set()
            assert self.release.wait(30), "the sync never asked the engine to stop"
        return scores


def teacher_logprobs(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """``model``'s log-prob of each of ``ids`` after ``prompt`` and the ids before it (one forward)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits.float()[0]
    steps = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return steps.gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)


def test_partial_rollout_a_sync_cuts_the_turn_in_flight_which_ends_on_the_new_weights(qwen2_head32_pair, models):
    """runner.partial_rollout: a sync lands while a long turn is being generated. The sync does not wait for the
    turn: the engine stops after its current decode step, the weights load, and the turn goes on from its prompt and
    its tokens so far on the new weights. Its reply carries two versions, the old one on the tokens sampled before
    the sync; the early tokens' log-probs are the old weights' (not scored again by the new ones), the later ones
    the new weights', and the ids are the old model's greedy prefix followed by the new model's greedy
    continuation."""
    log: list = []
    w = worker(qwen2_head32_pair[0], models[1], log)
    w.partial, w.generator.interruptible = True, True
    long = SamplingParams(max_new_tokens=24, do_sample=False)
    prompt = [5, 9, 11, 13, 17]
    old_ids = w.generator.generate_batch_sync([prompt], long)[0].output_ids
    assert len(old_ids) == 24, "the old model's greedy turn must run to the budget for the sync to land inside it"
    hold = HoldAtToken(len(prompt), 6, w.generator.sync_pending)
    w.generator.logits_processors = [hold]

    async def go():
        generator, requests, loop = await serving(w, log)
        in_flight = asyncio.create_task(generator.generate(prompt, long))
        await until(hold.reached.is_set, "the turn to have sampled 6 tokens")
        await asyncio.wait_for(w._receive_and_load(DRIVER_VERSION), 60)  # returns before the turn ends
        synced_before_the_turn_ended = not in_flight.done()
        reply = await asyncio.wait_for(in_flight, 60)
        await stop(requests, loop)
        return reply, synced_before_the_turn_ended

    reply, synced_first = asyncio.run(go())
    assert synced_first, "the sync waited for the whole turn"
    versions = reply.weight_version
    assert isinstance(versions, list) and len(versions) == len(reply.output_ids) == 24
    cut = versions.count(INITIAL_WEIGHT_VERSION)
    assert versions == [INITIAL_WEIGHT_VERSION] * cut + [DRIVER_VERSION] * (24 - cut) and 6 <= cut < 24
    assert reply.output_ids[:cut] == old_ids[:cut]  # sampled by the old weights, kept as they were
    w.generator.logits_processors = []
    rest = w.generator.generate_batch_sync([prompt + old_ids[:cut]], long.with_updates(max_new_tokens=24 - cut))[0]
    assert reply.output_ids[cut:] == rest.output_ids  # the new weights went on from prompt + prefix

    got = torch.tensor(reply.logprobs)  # models: the old (the engine's start) and the new (the synced) weights
    under_old, under_new = (teacher_logprobs(m, prompt, reply.output_ids) for m in models)
    assert torch.allclose(got[:cut], under_old[:cut], atol=1e-4)  # the behaviour log-probs of the weights that sampled
    assert torch.allclose(got[cut:], under_new[cut:], atol=1e-4)
    assert not torch.allclose(under_old[:cut], under_new[:cut], atol=1e-2)  # rescoring the prefix would show
