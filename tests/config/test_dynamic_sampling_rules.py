"""The rules of dynamic sampling (config/rules/dynamic_sampling.py): every bad combination of
``algorithm.max_num_gen_batches`` is refused naming the key and its fix; the good ones pass."""

from __future__ import annotations

import pytest

from rlinf_ext.config import check_config

KEY = "algorithm.max_num_gen_batches"
DYNAMIC = ["algorithm.adv_type=grpo_dynamic"]
ASYNC = ["runner.max_staleness=1", "rollout.return_logprobs=true"]


def issues(overrides: list[str]) -> list[tuple[str, str, str]]:
    return [(i.key, i.reason, i.fix) for i in check_config("tiny-cpu", overrides).issues]


@pytest.mark.parametrize("n", [0, -1])
def test_fewer_than_one_batch_is_refused(n):
    [(key, reason, fix)] = issues(DYNAMIC + [f"{KEY}={n}"])
    assert key == KEY and f"{KEY}={n}" in reason and f"{KEY}=1" in fix


def test_refills_without_grpo_dynamic_are_refused():
    [(key, reason, fix)] = issues([f"{KEY}=3"])
    assert key == KEY and "algorithm.adv_type=grpo drops none" in reason
    assert "algorithm.adv_type=grpo_dynamic" in fix and f"{KEY}=1" in fix


def test_refills_with_batches_dispatched_ahead_are_refused():
    [(key, reason, fix)] = issues(DYNAMIC + ASYNC + [f"{KEY}=2"])
    assert key == KEY and "runner.max_staleness=1" in reason and "runner.max_staleness=0" in fix


def test_dynamic_sampling_is_accepted_with_and_without_refill():
    assert check_config("tiny-cpu", DYNAMIC + [f"{KEY}=4"]).ok
    assert check_config("tiny-cpu", DYNAMIC + ASYNC + [f"{KEY}=1"]).ok  # drop without refill: any k
    assert check_config("tiny-cpu", [f"{KEY}=1"]).ok


def test_group_admission_with_dynamic_sampling_is_refused():
    [(key, reason, fix)] = issues(DYNAMIC + ["runner.admission=group"])
    assert key == "runner.admission" and "grpo_dynamic" in reason and "runner.admission=batch" in fix
    assert check_config("tiny-cpu", ASYNC + ["runner.admission=group"]).ok
