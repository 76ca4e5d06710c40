"""A discrete-event simulation of the batch pipeline (``runner/pipeline.py``): k = ``runner.max_staleness``,
admission by batch or group, partial rollout on or off, a weight sync every n steps, the engine's queue in batch
order or in arrival order. It predicts trajectories/s from per-phase times, checks itself against the measured
2-core runs of ``benchmarks/async_bench.py``, then predicts the ratio best async / k = 0 at 8-GPU proportions.

    python benchmarks/async_sim.py [--measured benchmarks/results/async_longtail_2026-11-29_seed0.json ...]
                                   [--steps 8] [--seeds 0,1,2] [--gpu-train-s 20] [--gpu-sync-s 3] ...

Not a test: it prints figures (2-6 min on 2 cores). Pure functions, seeded; nothing is launched.

The model (one rollout engine group, one actor):

- A trajectory alternates generation turns and tool calls: ``1 + c`` turns, ``c`` drawn from ``Scenario.calls``; a
  tool call waits a lognormal latency (``benchmarks/slow_search.py``'s: median, p99) without the engine. A group
  (``group_size`` trajectories of one prompt) finishes with its last trajectory; a batch is ``trajectories``.
- The engine: ``batched`` (the HF engine, ``generation/hf.py``: one ``model.generate`` at a time over up to
  ``slots`` queued turns, all ending together, ``turn_s`` each call) or ``continuous`` (vLLM: ``slots`` turns at
  once, each its own lognormal time of median ``turn_s``). The queue serves the oldest batch first (``priority``, as
  the engines now do) or in arrival order.
- The driver, per step s: the weight sync (every ``sync_every`` steps; without partial rollout it first waits for
  the turns being generated, with it the engine stops for the sync alone), the dispatch of the batches the
  staleness bound allows (batch b once the engines hold version >= b - k; group admission: while at most k + 1
  batches of groups are untrained), the wait for step s's groups (batch s; by group: ``runner/admission.py:admit``
  itself; the actor recomputes the log-probs of the step's groups that have arrived meanwhile, ``recompute_s`` per
  step), then the rest of the actor's work (``train_s``: the update and the step's other work).
- 2 cores: the engine and the actor share the CPU: while both work, generation runs ``gen_slowdown`` and the actor
  ``train_slowdown`` times slower (calibrated, below). GPUs: separate devices, no slowdown.

Calibration (``calibrate``): ``turn_s`` so that the simulated k = 0 rollout time equals the measured one
(``time_rollout_s``); ``sync_s`` measured; both slowdowns = the k = 1 / k = 0 ratio of ``time_train_s``;
``recompute_s`` so that the k = 1 batch trajectories/s equal the measured ones (k = 0 hides all but the last
group's share in its wait, k >= 1 none: ``time_recompute`` itself counts waits), ``train_s`` = the k = 0 step
minus its wait, its sync and that last share. The other settings (partial, group) are predictions, printed beside
their measurements.

8-GPU proportions (``gpu_scenario``, every number an assumption, each a flag): a disaggregated 8xH100 run (the
placement k > 0 needs; k = 0 on the same placement), Search-R1's batch (512 prompts x 5 = 2560 trajectories,
``docs/searchr1-facts.md`` section 7) on vLLM with 1024 sequences at once, 0-3 searches per trajectory (max_turns
4), a turn of median 4 s (lognormal sigma 0.5), the same search tail, the actor's 20 s per step (6 s recompute,
14 s update) and a sync of 3 s: rollout (~ 50 s for the batch) >> train, as RLinf's published ~60 s steps on
8xH100 are mostly rollout. "partial" there assumes a sync that stops the engine without waiting for whole turns
(vLLM's ``pause_generation(mode="keep")``); the runner cuts turns only on HF today.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlinf_ext.runner.admission import Waiting, admit  # noqa: E402

Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile (slow_search.Z99)
MEASURED = (
    REPO / "benchmarks/results/async_longtail_2026-11-29_seed0.json",
    REPO / "benchmarks/results/async_longtail_2026-11-29_seeds12.json",
)


@dataclass(frozen=True)
class Scenario:
    """The per-phase times the pipeline is driven by (seconds)."""

    trajectories: int = 64  # per batch
    group_size: int = 8
    calls: tuple[float, ...] = (0.0, 1.0)  # P(a trajectory makes i tool calls)
    tool_median_s: float = 0.3
    tool_p99_s: float = 3.0
    engine: str = "batched"  # batched (HF) | continuous (vLLM)
    slots: int = 64  # turns served at once
    turn_s: float = 0.5  # one turn (batched: one engine call)
    turn_sigma: float = 0.0  # continuous: lognormal sigma of a turn's time
    recompute_s: float = 0.0  # the actor's log-prob recompute per step, group by group as they arrive
    train_s: float = 1.8  # the rest of the actor's work per step (the update, the step's other work)
    sync_s: float = 0.07
    gen_slowdown: float = 1.0  # generation while the actor works (shared cores)
    train_slowdown: float = 1.0  # the actor while the engine generates


@dataclass(frozen=True)
class Policy:
    """One pipeline setting."""

    k: int = 0
    admission: str = "batch"
    partial: bool = False
    sync_every: int = 1
    priority: bool = True

    def label(self) -> str:
        parts = [f"k={self.k}"] + ([self.admission] if self.k else [])
        parts += ["partial"] * self.partial + [f"sync/{self.sync_every}"] * (self.sync_every > 1)
        return " ".join(parts + ["fifo"] * (not self.priority))


@dataclass
class Result:
    step_end: list[float]  # when each step's training ended
    rollout_s: list[float]  # per batch: its dispatch to its last group
    wait_s: list[float]  # per step: the driver's wait for its groups
    trajectories: int

    @property
    def per_s(self) -> float:
        return self.trajectories * len(self.step_end) / self.step_end[-1]

    @property
    def per_s_after_first(self) -> float:
        return self.trajectories * (len(self.step_end) - 1) / (self.step_end[-1] - self.step_end[0])


def check_policy(policy: Policy) -> None:
    """Refuses what the pipeline cannot keep: a sync every n steps needs n - 1 <= k (else a batch waits for weights
    that are never sent)."""
    if policy.sync_every < 1 or policy.sync_every - 1 > policy.k:
        raise ValueError(
            f"sync_every={policy.sync_every} with k={policy.k}: batch s + k + 1 needs the weights of step "
            f"s + 1, so a sync may be skipped only while n - 1 <= k"
        )


def _lognormal(rng: random.Random, median: float, p99: float) -> float:
    sigma = math.log(p99 / median) / Z99 if p99 > median else 0.0
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def draw_batch(scenario: Scenario, seed: int, batch: int) -> list[list[tuple[float, float]]]:
    """Per trajectory, its turns as (generation work, tool latency after it; 0 after the last), drawn from the
    batch's own stream (the same batch is the same work under every policy) (pure)."""
    rng = random.Random(seed * 1_000_003 + batch)
    out = []
    for _ in range(scenario.trajectories):
        calls = rng.choices(range(len(scenario.calls)), weights=scenario.calls)[0]
        turns = []
        for i in range(calls + 1):
            spread = math.exp(scenario.turn_sigma * rng.gauss(0.0, 1.0)) if scenario.turn_sigma else 1.0
            work = scenario.turn_s * spread
            tool = _lognormal(rng, scenario.tool_median_s, scenario.tool_p99_s) if i < calls else 0.0
            turns.append((work, tool))
        out.append(turns)
    return out


class _Sim:
    """The event loop. Work clocks: the engine's and the actor's progress advance at their current rates (1, a
    slowdown's inverse, or 0 during a sync), so a turn ends when the engine clock reaches its start plus its work."""

    def __init__(self, scenario: Scenario, policy: Policy, steps: int, seed: int):
        check_policy(policy)
        self.sc, self.po, self.steps, self.seed = scenario, policy, steps, seed
        self.t = 0.0
        self.engine_clock = 0.0
        self.running: list[tuple[float, int, tuple]] = []  # heap (engine clock at its end, seq, turn)
        self.queue: list[tuple] = []  # heap (priority, seq, turn)
        self.tools: list[tuple[float, int, tuple]] = []  # heap (time, seq, turn)
        self.seq = 0
        self.frozen = False  # a sync holds the engine
        self.admitting = True
        # trajectories: [batch, group, turns, next turn index]; groups: remaining trajectories
        self.group_left: dict[tuple[int, int], int] = {}
        self.group_version: dict[tuple[int, int], int] = {}
        self.group_done: dict[tuple[int, int], int] = {}  # arrival rank
        self.batch_start: dict[int, float] = {}
        self.batch_end: dict[int, float] = {}
        self.batch_left: dict[int, int] = {}
        self.arrivals = 0

    # ---- engine
    def gen_rate(self, actor_busy: bool) -> float:
        if self.frozen:
            return 0.0
        return 1.0 / self.sc.gen_slowdown if actor_busy else 1.0

    def enqueue(self, traj: list) -> None:
        batch = traj[0]
        self.seq += 1
        heapq.heappush(self.queue, ((batch if self.po.priority else 0), self.seq, traj))

    def admit_turns(self) -> None:
        if self.frozen or not self.admitting or not self.queue:
            return
        if self.sc.engine == "batched":
            if self.running:
                return
            rows = [heapq.heappop(self.queue)[2] for _ in range(min(self.sc.slots, len(self.queue)))]
            work = max(traj[2][traj[3]][0] for traj in rows)
            for traj in rows:
                self.seq += 1
                heapq.heappush(self.running, (self.engine_clock + work, self.seq, traj))
            return
        while self.queue and len(self.running) < self.sc.slots:
            traj = heapq.heappop(self.queue)[2]
            self.seq += 1
            heapq.heappush(self.running, (self.engine_clock + traj[2][traj[3]][0], self.seq, traj))

    def turn_done(self, traj: list) -> None:
        tool = traj[2][traj[3]][1]
        traj[3] += 1
        if traj[3] < len(traj[2]):
            self.seq += 1
            heapq.heappush(self.tools, (self.t + tool, self.seq, traj))
            return
        key = (traj[0], traj[1])
        self.group_left[key] -= 1
        if not self.group_left[key]:
            self.group_done[key] = self.arrivals
            self.arrivals += 1
            self.batch_left[traj[0]] -= 1
            if not self.batch_left[traj[0]]:
                self.batch_end[traj[0]] = self.t

    def dispatch(self, batch: int, version: int) -> None:
        sc = self.sc
        self.batch_start[batch] = self.t
        groups = sc.trajectories // sc.group_size
        self.batch_left[batch] = groups
        for g in range(groups):
            self.group_left[(batch, g)] = sc.group_size
            self.group_version[(batch, g)] = version
        for i, turns in enumerate(draw_batch(sc, self.seed, batch)):
            self.enqueue([batch, i // sc.group_size, turns, 0])
        self.admit_turns()

    # ---- time
    def advance(self, until: float | None, actor_work: float | None) -> float | None:
        """Run the engine and the tools to the first of: ``until``, the actor's work done (``actor_work`` seconds
        of it left; None: the actor is idle), or an event the driver waits on (returns then). Returns the actor's
        work left."""
        while True:
            actor_busy = actor_work is not None and actor_work > 0
            rate = self.gen_rate(actor_busy)
            a_rate = (1.0 / self.sc.train_slowdown) if (self.running and rate > 0) else 1.0
            candidates = []
            if self.running and rate > 0:
                candidates.append(self.t + (self.running[0][0] - self.engine_clock) / rate)
            if self.tools:
                candidates.append(self.tools[0][0])
            if actor_busy:
                candidates.append(self.t + actor_work / a_rate)
            if until is not None:
                candidates.append(until)
            if not candidates:
                raise RuntimeError("the simulation waits on nothing")
            nxt = max(min(candidates), self.t)
            dt = nxt - self.t
            self.engine_clock += dt * rate
            if actor_busy:
                actor_work = max(actor_work - dt * a_rate, 0.0)
            self.t = nxt
            while self.running and self.running[0][0] <= self.engine_clock + 1e-12 and rate > 0:
                self.turn_done(heapq.heappop(self.running)[2])
            while self.tools and self.tools[0][0] <= self.t + 1e-12:
                self.enqueue(heapq.heappop(self.tools)[2])
            self.admit_turns()
            if actor_busy and actor_work <= 1e-12:
                return 0.0
            if until is not None:
                if self.t >= until:
                    return actor_work
            elif actor_work is None:
                return None  # one event handled: the driver looks again

    def run(self) -> Result:
        po, sc = self.po, self.sc
        groups = sc.trajectories // sc.group_size
        version, dispatched = 0, 0
        step_end, wait_s = [], []
        untrained: set[tuple[int, int]] = set()
        for s in range(self.steps):
            if s > 0 and s % po.sync_every == 0:
                self.admitting = False
                if not po.partial:  # the sync waits for the turns being generated
                    while self.running:
                        self.advance(None, None)
                self.frozen = True
                self.advance(self.t + sc.sync_s, None)
                self.frozen, self.admitting = False, True
                version = s
            cap = (po.k + 1) * groups
            while (
                dispatched < self.steps
                and dispatched - po.k <= version
                and (po.admission == "batch" or len(untrained) + groups <= cap)
            ):
                self.dispatch(dispatched, version)
                untrained |= {(dispatched, g) for g in range(groups)}
                dispatched += 1
            self.admit_turns()
            started = self.t
            per_group, recomputed = sc.recompute_s / groups, 0.0

            def recompute_or_wait(arrived: int) -> None:
                """The actor recomputes the arrived groups' log-probs, or (none left) the driver waits one event."""
                nonlocal recomputed
                ready = per_group * min(arrived, groups) - recomputed
                if ready > 1e-12:
                    self.advance(None, ready)
                    recomputed += ready
                else:
                    self.advance(None, None)

            if po.admission == "batch":
                while s not in self.batch_end:
                    recompute_or_wait(groups - self.batch_left[s])
                picked = [(s, g) for g in range(groups)]
            else:
                uid = {key: f"{key[0]}-{key[1]}" for key in untrained}
                while True:
                    waiting = [
                        Waiting(uid[key], self.group_version[key], self.group_done.get(key)) for key in untrained
                    ]
                    chosen = admit(waiting, s, groups, po.k)
                    if chosen is not None:
                        break
                    seen = self.arrivals
                    while self.arrivals == seen:  # admit looks again only when a group has finished
                        recompute_or_wait(sum(key in self.group_done for key in untrained))
                back = {v: key for key, v in uid.items()}
                picked = [back[u] for u in chosen]
            untrained -= set(picked)
            wait_s.append(self.t - started)
            left = sc.recompute_s - recomputed + sc.train_s
            while left and left > 0:
                left = self.advance(None, left)
            step_end.append(self.t)
        rollout = [self.batch_end[b] - self.batch_start[b] for b in sorted(self.batch_end)]
        return Result(step_end, rollout, wait_s, sc.trajectories)


def simulate(scenario: Scenario, policy: Policy, steps: int = 8, seed: int = 0) -> Result:
    """One run of ``steps`` steps (pure: the same arguments give the same result)."""
    return _Sim(scenario, policy, steps, seed).run()


def mean_over_seeds(scenario: Scenario, policy: Policy, steps: int, seeds: Sequence[int], figure: str) -> float:
    values = []
    for seed in seeds:
        r = simulate(scenario, policy, steps, seed)
        values.append(
            {
                "per_s": r.per_s,
                "after_first": r.per_s_after_first,
                "rollout_s": statistics.mean(r.rollout_s),
                "wait_s": statistics.mean(r.wait_s),
            }[figure]
        )
    return statistics.mean(values)


def _solve(f, target: float, lo: float, hi: float, iters: int = 30) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (bisection)."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# ------------------------------------------------------------------------------------------------ measured runs
def load_measured(paths: Sequence[Path]) -> list[dict]:
    runs = []
    for path in paths:
        runs += json.loads(Path(path).read_text())
    return runs


def policy_of(setting: dict) -> Policy:
    return Policy(int(setting["k"]), setting["admission"], bool(setting["partial"]))


def measured_means(runs: Sequence[dict]) -> dict[Policy, dict[str, float]]:
    """Per setting, the mean over seeds of the figures the simulation is compared with."""
    by: dict[Policy, list[dict]] = {}
    for run in runs:
        by.setdefault(policy_of(run["setting"]), []).append(run)
    out = {}
    for policy, rs in by.items():
        steps = [[b - a for a, b in zip([0.0] + r["elapsed_s"][:-1], r["elapsed_s"])] for r in rs]
        out[policy] = {
            "per_s": statistics.mean(r["trajectories_per_s"] for r in rs),
            "rollout_s": statistics.mean(r["time_rollout_s"] for r in rs),
            "wait_s": statistics.mean(r["wait_rollout_s"] for r in rs),
            "train_s": statistics.mean(r["time_train_s"] for r in rs),
            "sync_s": statistics.mean(r["time_sync_s"] for r in rs),
            "step_s": statistics.mean(x for st in steps for x in st),
            "after_first": statistics.mean(
                64 * (len(r["elapsed_s"]) - 1) / (r["elapsed_s"][-1] - r["elapsed_s"][0]) for r in rs
            ),
        }
    return out


def calibrate(measured: dict[Policy, dict[str, float]], base: Scenario, steps: int, seeds: Sequence[int]) -> Scenario:
    """The 2-core scenario from the measured k = 0 and k = 1 batch runs (the module docstring)."""
    k0, k1 = measured[Policy(0)], measured[Policy(1, "batch", False)]
    slowdown = k1["train_s"] / k0["train_s"]
    after_wait = k0["step_s"] - k0["wait_s"] - k0["sync_s"]  # k = 0: what the actor does once the batch is in
    groups = base.trajectories // base.group_size
    sc = dataclasses.replace(base, sync_s=k0["sync_s"], train_slowdown=slowdown, gen_slowdown=slowdown)

    def with_recompute(x: float) -> Scenario:  # the last group's recompute is the only share k = 0 does not hide
        return dataclasses.replace(sc, recompute_s=x, train_s=after_wait - x / groups)

    turn = _solve(
        lambda x: mean_over_seeds(
            dataclasses.replace(sc, turn_s=x, train_s=after_wait), Policy(0), steps, seeds, "rollout_s"
        ),
        k0["rollout_s"],
        0.01,
        5.0,
    )
    sc = dataclasses.replace(sc, turn_s=turn)
    # trajectories/s fall as the recompute grows: solve on their negative
    recompute = _solve(
        lambda x: -mean_over_seeds(with_recompute(x), Policy(1), steps, seeds, "per_s"),
        -k1["per_s"],
        0.0,
        min(after_wait * groups, 10.0),
    )
    return with_recompute(recompute)


def gpu_scenario(args: argparse.Namespace) -> Scenario:
    return Scenario(
        trajectories=args.gpu_prompts * args.gpu_group,
        group_size=args.gpu_group,
        calls=tuple(float(x) for x in args.gpu_calls.split(",")),
        engine="continuous",
        slots=args.gpu_slots,
        turn_s=args.gpu_turn_s,
        turn_sigma=args.gpu_turn_sigma,
        recompute_s=args.gpu_recompute_s,
        train_s=args.gpu_train_s,
        sync_s=args.gpu_sync_s,
    )


GRID = (
    Policy(0),
    Policy(1),
    Policy(1, partial=True),
    Policy(1, "group"),
    Policy(1, "group", True),
    Policy(1, priority=False),
    Policy(1, partial=True, priority=False),
    Policy(1, sync_every=2),
    Policy(1, partial=True, sync_every=2),
    Policy(2),
    Policy(2, partial=True),
    Policy(2, "group", True),
    Policy(2, sync_every=2),
    Policy(2, partial=True, sync_every=2),
    Policy(2, partial=True, sync_every=3),
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", nargs="+", type=Path, default=list(MEASURED))
    parser.add_argument("--steps", type=int, default=8, help="steps per simulated run (the benchmark's 8)")
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7", help="simulated seeds, averaged")
    parser.add_argument("--gpu-steps", type=int, default=8)
    parser.add_argument("--gpu-prompts", type=int, default=512)
    parser.add_argument("--gpu-group", type=int, default=5)
    parser.add_argument("--gpu-calls", default="0.1,0.5,0.3,0.1", help="P(0, 1, 2, 3 searches) per trajectory")
    parser.add_argument("--gpu-slots", type=int, default=1024, help="sequences the engines run at once")
    parser.add_argument("--gpu-turn-s", type=float, default=4.0, help="a turn's median generation time")
    parser.add_argument("--gpu-turn-sigma", type=float, default=0.5)
    parser.add_argument("--gpu-recompute-s", type=float, default=6.0, help="the actor's log-prob recompute per step")
    parser.add_argument("--gpu-train-s", type=float, default=14.0, help="the actor's update and the rest per step")
    parser.add_argument("--gpu-sync-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]

    measured = measured_means(load_measured(args.measured))
    two = calibrate(measured, Scenario(), args.steps, seeds)
    print(
        f"2-core scenario, calibrated: turn {two.turn_s:.3f} s, actor {two.recompute_s:.2f} s recompute + "
        f"{two.train_s:.2f} s/step, sync "
        f"{two.sync_s:.3f} s, generation x{two.gen_slowdown:.2f} and actor x{two.train_slowdown:.2f} slower "
        f"while both work; {two.trajectories} trajectories, 0-1 search (lognormal 0.3 s / p99 3 s)"
    )
    base = mean_over_seeds(two, Policy(0), args.steps, seeds, "per_s")
    print(
        f"{'setting':<26}{'sim traj/s':>11}{'measured':>10}{'sim vs k=0':>11}{'measured':>10}"
        f"{'sim rollout s':>14}{'measured':>10}"
    )
    for policy in GRID:
        sim = mean_over_seeds(two, policy, args.steps, seeds, "per_s")
        roll = mean_over_seeds(two, policy, args.steps, seeds, "rollout_s")
        m = measured.get(policy)
        mk0 = measured[Policy(0)]["per_s"]
        cells = (
            (f"{m['per_s']:>10.2f}", f"{m['per_s'] / mk0:>10.2f}", f"{m['rollout_s']:>10.2f}")
            if m
            else (f"{'-':>10}",) * 3
        )
        print(f"{policy.label():<26}{sim:>11.2f}{cells[0]}{sim / base:>11.2f}{cells[1]}{roll:>14.2f}{cells[2]}")

    gpu = gpu_scenario(args)
    print(
        f"\n8-GPU proportions (assumed, see --help): {gpu.trajectories} trajectories/batch, vLLM {gpu.slots} "
        f"at once, turn median {gpu.turn_s} s (sigma {gpu.turn_sigma}), searches P={gpu.calls}, lognormal "
        f"0.3 s / p99 3 s, actor {gpu.recompute_s} s recompute + {gpu.train_s} s, sync {gpu.sync_s} s, no shared "
        "devices"
    )
    g_seeds = seeds[:3]
    gbase = mean_over_seeds(gpu, Policy(0), args.gpu_steps, g_seeds, "per_s")
    print(f"{'setting':<26}{'traj/s':>9}{'vs k=0':>8}{'after step 1':>13}{'rollout s':>10}{'wait s':>8}")
    best, waiting = (0.0, ""), (0.0, "")  # waiting: syncs that wait for whole turns (vLLM, SGLang today)
    for policy in GRID:
        r = [simulate(gpu, policy, args.gpu_steps, seed) for seed in g_seeds]
        per_s = statistics.mean(x.per_s for x in r)
        after = statistics.mean(x.per_s_after_first for x in r) / statistics.mean(
            x.per_s_after_first for x in (simulate(gpu, Policy(0), args.gpu_steps, seed) for seed in g_seeds)
        )
        print(
            f"{policy.label():<26}{per_s:>9.1f}{per_s / gbase:>8.2f}{after:>13.2f}"
            f"{statistics.mean(statistics.mean(x.rollout_s) for x in r):>10.1f}"
            f"{statistics.mean(statistics.mean(x.wait_s) for x in r):>8.1f}"
        )
        if policy.k and per_s / gbase > best[0]:
            best = (per_s / gbase, policy.label())
        if policy.k and not policy.partial and per_s / gbase > waiting[0]:
            waiting = (per_s / gbase, policy.label())
    print(
        f"\npredicted best async / k=0 at 8-GPU proportions: {best[0]:.2f}x ({best[1]}); without partial "
        f"rollout (a sync waits for whole turns): {waiting[0]:.2f}x ({waiting[1]})"
    )


if __name__ == "__main__":
    main()
