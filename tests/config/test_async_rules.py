"""The rules of batches dispatched ahead (``runner.max_staleness``, config/rules/async_rollout.py): each refusal
names the key and its fix, and the plan counts the k + 1 batches in flight against the engines' concurrency."""

from __future__ import annotations

import pytest

from rlinf_ext.config import check_config, load_config
from rlinf_ext.config.commands import format_plan

pytestmark = pytest.mark.usefixtures("sglang_profile_installed")

KEY = "runner.max_staleness"
ASYNC = [f"{KEY}=1", "rollout.return_logprobs=true"]
DISAGGREGATED = [
    "cluster.component_placement={actor: 0-5, 'rollout,reward': 6-7}",
    "data.rollout_batch_size=24",
    "actor.offload_weight=false",
    "actor.offload_optimizer=false",
    "actor.offload_grad=false",
]


def staleness_issues(name: str, overrides: list[str]) -> list[str]:
    return [f"{i.reason} fix: {i.fix}" for i in check_config(name, overrides).issues if i.key == KEY]


def test_k_above_zero_is_accepted_where_it_can_overlap(reference_env):
    assert check_config("tiny-cpu", ASYNC).ok
    assert check_config("qwen2.5-3b-tool-1node", ASYNC + DISAGGREGATED).ok


def test_collocated_gpus_are_refused(reference_env):
    [issue] = staleness_issues("qwen2.5-3b-tool-1node", ASYNC)
    assert "collocated" in issue and "runner.max_staleness=0" in issue and "cluster.component_placement" in issue
    assert check_config("qwen2.5-3b-tool-1node", [f"{KEY}=0"]).ok  # k = 0: today's collocated run


def test_engine_logprobs_are_required():
    [issue] = staleness_issues("tiny-cpu", [f"{KEY}=2", "rollout.return_logprobs=false"])
    assert "rollout.return_logprobs=true" in issue


def test_mmsearch_is_refused_until_its_logprobs_are_shown_aligned():
    [issue] = staleness_issues("tiny-mm-cpu", ASYNC)
    assert "mmsearch" in issue and "re-tokenises" in issue and "runner.max_staleness=0" in issue
    assert not staleness_issues("tiny-mm-cpu", [f"{KEY}=0"])


def test_negative_k_is_refused():
    [issue] = staleness_issues("tiny-cpu", [f"{KEY}=-1"])
    assert "runner.max_staleness=0" in issue


def test_plan_counts_the_batches_in_flight(reference_env):
    assert "batches in flight" not in format_plan(load_config("tiny-cpu"))
    plan = format_plan(
        load_config(
            "tiny-cpu", ASYNC + ["runner.max_staleness=2", "rollout.max_running_requests=64", "algorithm.group_size=4"]
        )
    )
    assert "3 x 8 prompts x 4 = 96 trajectories, 96 per engine (1 engine(s))" in plan
    assert "! 32 trajectories per engine wait in its queue; rollout.max_running_requests=96" in plan
    gpu = format_plan(load_config("qwen2.5-3b-tool-1node", ASYNC + DISAGGREGATED))
    assert "2 x 24 prompts x 4 = 192 trajectories, 96 per engine (2 engine(s))" in gpu
    assert "KV cache:" in gpu and "wait in its queue" not in gpu


def test_plan_says_what_a_kv_cache_short_of_the_running_turns_costs(reference_env):
    """vLLM preempts turns the KV cache cannot hold, and a sync's wait-mode pause passes them by: they finish on the
    new weights (issue 42). The plan names that cost, not only the recompute."""
    overrides = ASYNC + DISAGGREGATED + ["rollout.rollout_backend=vllm"]
    assert "! the KV cache" not in format_plan(load_config("qwen2.5-3b-tool-1node", overrides))
    plan = format_plan(load_config("qwen2.5-3b-tool-1node", overrides + ["rollout.gpu_memory_utilization=0.2"]))
    assert "! the KV cache holds 33 full sequences for 96 running ones" in plan
    assert "its tokens span two versions (async/trajectories_two_versions)" in plan


def partial_issues(name: str, overrides: list[str]) -> list[str]:
    return [
        f"{i.reason} fix: {i.fix}" for i in check_config(name, overrides).issues if i.key == "runner.partial_rollout"
    ]


def test_partial_rollout_needs_batches_in_flight_and_an_engine_that_stops_between_decode_steps(reference_env):
    on = "runner.partial_rollout=true"
    assert check_config("tiny-cpu", ASYNC + [on, "rollout.rollout_backend=hf"]).ok
    [issue] = partial_issues("tiny-cpu", [on, "rollout.rollout_backend=hf"])  # k = 0
    assert "nothing to cut" in issue and "runner.max_staleness=1" in issue
    assert check_config("tiny-cpu", ASYNC + [on, "rollout.rollout_backend=vllm"]).ok  # vLLM's keep pause
    [issue] = partial_issues("tiny-cpu", ASYNC + [on, "rollout.rollout_backend=sglang"])
    assert "rollout.rollout_backend=sglang" in issue and "only vllm, hf's" in issue
    assert "runner.partial_rollout=false" in issue


@pytest.mark.parametrize("n,ok", [(-1, True), (1, True), (2, True), (3, False), (0, False)])
def test_in_flight_batches_stay_within_k_plus_one(n, ok):
    result = check_config(
        "tiny-cpu",
        [
            "runner.max_staleness=1",
            "rollout.return_logprobs=true",
            "runner.admission=group",
            f"runner.in_flight_batches={n}",
        ],
    )
    assert result.ok == ok
    if not ok:
        [issue] = result.issues
        assert issue.key == "runner.in_flight_batches" and "1..2" in issue.fix


@pytest.mark.parametrize(
    "overrides,fix",
    [
        (["runner.sync_every=0"], "runner.sync_every=1"),
        (["runner.sync_every=3"], "runner.max_staleness=2 or more"),
        (["runner.sync_every=2", "runner.admission=group"], "runner.admission=batch"),
        (["runner.sync_every=2"], None),
    ],
)
def test_a_sync_every_n_steps_stays_within_the_staleness_bound(overrides, fix):
    result = check_config("tiny-cpu", ["runner.max_staleness=1", "rollout.return_logprobs=true", *overrides])
    if fix is None:
        assert result.ok, result.issues
    else:
        [issue] = result.issues
        assert issue.key == "runner.sync_every" and fix in issue.fix
