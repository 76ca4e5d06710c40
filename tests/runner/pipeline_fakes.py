"""A whole GRPOTrainer run without Ray, for the driver tests (test_trainer_pipeline.py): the real trainer (its
``__init__``, its data order, ``KeyedChannel`` views, checkpoints on disk) over an in-memory stand-in of RLinf's
``Channel`` and fake worker groups, each group call checked against the worker classes (group_fakes.py).

The fake workers act as late as the real ones can: a call does its work when the trainer waits for it. The agent
loop puts a batch's results on its Rollout queue when the trainer waits for any batch, the batches in flight
newest first (so a Rollout queue shared by several batches would hand the oldest step the newest batch's
results), and returns only when its own handle is waited. Reading an empty queue raises: under Ray it would block
for ever. The engines' weight version is the number of updates the actor had made at the last sync.

Under group admission (the batches' results go to the shared Rollout stream) the agent loop finishes one group each
time the driver finds the stream empty: the first unfinished group in dispatch order whose prompt is not ``slow``,
else the first slow one (a slow group finishes only when nothing else can).
"""

from __future__ import annotations

import collections
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from group_fakes import FuncResult, check_group_call
from rlinf.scheduler import Channel, WorkerGroupFuncResult

from rlinf_ext.protocol import channels as ch
from rlinf_ext.runner.groups import Placement, WorkerGroups
from rlinf_ext.sync.weight_sync import SyncRoutes
from rlinf_ext.workers.returns import AgentLoopOutput, FinishedGroup, RewardOutput
from tests.support.signature_checks import checked_against

AGENT_LOOP_CALL = "agent_loop.run_agentloop_rollout"


class Got:
    """An asynchronous ``get``'s work as the driver gets it (RLinf's ``AsyncRayWork``: ``wait`` only, no
    completion test): the item is taken when it is asked for."""

    def __init__(self, channel: "MemoryChannel", key: Any):
        self.channel, self.key = channel, key

    def done(self) -> bool:
        raise NotImplementedError("RLinf's AsyncRayWork (a driver's async get) has no done(); it only waits")

    def wait(self) -> Any:
        return self.channel.get(self.key)


class MemoryChannel:
    """RLinf's ``Channel``: one FIFO per key, in memory; ``on_empty(key)`` may fill an empty queue before a get."""

    def __init__(self):
        self.queues: dict[Any, collections.deque] = collections.defaultdict(collections.deque)
        self.on_empty: Callable[[Any], None] = lambda key: None

    @staticmethod
    @checked_against(Channel.create)
    def create(name, maxsize=0, distributed=False, node_rank=0, local=False, disable_distributed_log=True):
        return MemoryChannel()

    @checked_against(Channel.put)
    def put(self, item, weight=0, key="default_queue", async_op=False):
        self.queues[key].append(item)

    @checked_against(Channel.get)
    def get(self, key="default_queue", async_op=False):
        if async_op:
            return Got(self, key)
        if not self.queues[key]:
            self.on_empty(key)
        if not self.queues[key]:
            raise AssertionError(f"get from the empty queue {key!r}: under Ray this call would wait for ever")
        return self.queues[key].popleft()


class LazyResult(FuncResult):
    """A group call's result whose work runs at the first ``wait()``; ``done()`` only after it."""

    def __init__(self, world: "World", name: str, work: Callable[[], list]):
        super().__init__([])
        self.world, self.name, self.work, self.finished = world, name, work, False

    @checked_against(WorkerGroupFuncResult.wait)
    def wait(self):
        if not self.finished:
            self.world.log.append(("wait", self.name))
            self.values, self.finished = self.work(), True
        return self.values

    @checked_against(WorkerGroupFuncResult.done)
    def done(self):
        return self.finished


def reward_of(uid: str, index: int) -> float:
    return float((sum(map(ord, uid)) + index) % 3) / 2


class World:
    """What the fake workers share and record."""

    def __init__(self, group_size: int):
        self.group_size = group_size
        self.log: list[tuple[str, str]] = []
        self.engine_version = 0
        self.updates = 0  # run_training calls finished
        self.requests: dict[int, Any] = {}  # batch -> its AgentRolloutRequest
        self.dispatched: list[tuple[int, int, Any]] = []  # (batch, refill, request) per agent-loop call, in order
        self.reward: Callable[[str, int], float] = reward_of  # (group uid, trajectory index) -> reward
        self.rewarded: dict[int, list[str]] = {}  # step -> uids scored
        self.trained: dict[int, list[str]] = {}  # step -> uids trained
        self.loads: list[str] = []
        self.rollouts: list[dict] = []  # one per agent-loop call: batch, handle, results put
        self.most_in_flight = 0  # agent-loop calls running at once
        self.most_untrained = 0  # groups dispatched and not trained yet, at most at once
        self.behaviour_metrics = False  # run_training returns the decoupled loss's metrics
        self.failing_batches: set[int] = set()  # their agent-loop calls fail when waited on
        self.slow: set[str] = set()  # group admission: prompt uids whose groups finish only when nothing else can
        self.finished_groups: list[str] = []  # group admission: the uids in the order their groups finished

    # ---- agent loop
    def run_agentloop_rollout(self, input_channel, output_channel):
        request = input_channel.get()
        batch, _, refill = request.uids[0].split("-")[0][1:].partition("r")  # s<batch>[r<refill>]-<k>-<prompt>
        batch, refill = int(batch), int(refill or 0)
        self.dispatched.append((batch, refill, request))
        if refill == 0:
            self.requests[batch] = request
        by_group = output_channel.name.endswith(ch.STREAM)
        call = {
            "batch": batch,
            "request": request,
            "out": output_channel,
            "version": self.engine_version,
            "put": False,
            "by_group": by_group,
            "unsent": list(request.uids) if by_group else [],
        }
        if by_group:
            output_channel.channel.on_empty = self._finish_next_group
        call["handle"] = LazyResult(self, AGENT_LOOP_CALL, lambda: self._finish(call))
        self.rollouts.append(call)
        self.most_in_flight = max(self.most_in_flight, sum(not c["handle"].finished for c in self.rollouts))
        untrained = {u for c in self.rollouts for u in c["request"].uids} - {
            u for t in self.trained.values() for u in t
        }
        self.most_untrained = max(self.most_untrained, len(untrained))
        return call["handle"]

    def _records(self, call: dict, uids: list[str]) -> list[dict]:
        # two turns: the first sampled at the dispatch version, then an observation, then the engine's version now
        versions = [call["version"]] * 2 + [-1] + [self.engine_version] * 2
        return [
            {"uid": uid, "index": i, "prompt_ids": [1], "response_ids": [2] * len(versions), "versions": versions}
            for uid in uids
            for i in range(self.group_size)
        ]

    def _send_group(self, call: dict, uid: str) -> None:
        call["unsent"].remove(uid)
        records = self._records(call, [uid])
        self.finished_groups.append(uid)
        call["out"].put(
            FinishedGroup(
                SimpleNamespace(uid=uid),
                AgentLoopOutput(
                    trajectories=records,
                    metrics={"agent/turns": 2.0},
                    num_trajectories=len(records),
                    tool_calls=0,
                    tool_time=0.0,
                    wall_time=0.0,
                ),
            )
        )

    def _finish_next_group(self, key) -> None:
        waiting = [(call, uid) for call in self.rollouts if call["by_group"] for uid in call["unsent"]]
        fast = [(call, uid) for call, uid in waiting if uid.split("-", 2)[2] not in self.slow]
        if waiting:
            self._send_group(*(fast or waiting)[0])

    def _put_results(self) -> None:
        for call in reversed(self.rollouts):  # newest first
            if not call["put"] and not call["by_group"]:
                for uid in call["request"].uids:
                    call["out"].put(SimpleNamespace(uid=uid))
                call["put"] = True

    def _finish(self, call: dict) -> list:
        if call["batch"] in self.failing_batches:
            raise RuntimeError(f"batch {call['batch']}'s rollout failed")
        self._put_results()
        for uid in list(call["unsent"]):  # group admission: a call ends once all its groups are out
            self._send_group(call, uid)
        records = self._records(call, call["request"].uids)
        return [
            AgentLoopOutput(
                trajectories=records,
                metrics={"agent/turns": 2.0},
                num_trajectories=len(records),
                tool_calls=0,
                tool_time=0.0,
                wall_time=0.0,
            )
        ]

    # ---- reward
    def compute_rewards(self, input_channel, output_channel, num_results, step):
        def work():
            results = [input_channel.get() for _ in range(num_results)]
            self.rewarded[step] = [r.uid for r in results]
            rewards = {r.uid: [self.reward(r.uid, i) for i in range(self.group_size)] for r in results}
            for r in results:
                r.rewards = rewards[r.uid]
                output_channel.put(r)
            flat = [x for values in rewards.values() for x in values]
            return [RewardOutput(rewards=rewards, metrics={"reward/mean": sum(flat) / len(flat)})]

        return work

    # ---- actor
    def run_inference(self, input_channel, output_channel, compute_ref_logprobs, num_results):
        def work():
            for _ in range(num_results):
                output_channel.put(input_channel.get())
            return [None]

        return work

    def run_training(self, input_channel, num_results, step):
        def work():
            uids = sorted(input_channel.get().uid for _ in range(num_results))
            self.trained[step] = uids
            self.updates += 1
            training = {"loss": 0.5 + step, "lr": 1e-6}
            if self.behaviour_metrics:  # the decoupled loss's (training/rl_math.py:behaviour_weights)
                training.update(
                    {"behaviour_weight_mean": 0.9, "behaviour_weight_clip_fraction": 0.25, "behaviour_kl": 0.01}
                )
            return [({"reward_scores": 0.0}, [training])]

        return work

    def save_checkpoint(self, save_path, step):
        Path(save_path).mkdir(parents=True)
        (Path(save_path) / "model.pt").write_text(str(step))
        return [None]

    def load_checkpoint(self, load_path):
        self.loads.append(load_path)
        self.updates = int(Path(load_path).parent.name.removeprefix("global_step_"))  # <run>/global_step_N/actor
        return [None]

    def sync_model_from_actor(self, **kwargs):
        self.engine_version = self.updates
        return [None]


class FakeGroup:
    """A worker group: each call is checked against the component's worker classes and logged; the world does its
    work (a callable: done at the wait) or it returns None on every rank."""

    def __init__(self, component: str, world: World):
        self.component, self.world = component, world

    def __getattr__(self, method: str):
        name = f"{self.component}.{method}"

        def call(*args, **kwargs):
            check_group_call(self.component, method, *args, **kwargs)
            self.world.log.append(("call", name))
            if name == AGENT_LOOP_CALL:
                return self.world.run_agentloop_rollout(*args, **kwargs)
            own = getattr(self.world, method, None) if method not in ("rollout_serverless",) else None
            if own is None:
                return LazyResult(self.world, name, lambda: [None])
            reply = own(*args, **kwargs)
            return LazyResult(self.world, name, reply if callable(reply) else (lambda: reply))

        return call


def fake_groups(world: World) -> WorkerGroups:
    return WorkerGroups(
        **{c: FakeGroup(c, world) for c in ("rollout", "actor", "reward", "agent_loop")},
        placement=Placement(
            rollout_dp_size=1, agent_loop_world_size=1, actor_world_size=1, weight_sync=SyncRoutes("paired", 1, 1)
        ),
    )


def prompts(n: int) -> list[dict]:
    return [{"prompt_ids": [10 + i], "answers": [f"a{i}"], "uid": f"q{i}"} for i in range(n)]
