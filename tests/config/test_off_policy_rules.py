"""algorithm.off_policy: the behaviour-weight range rule, and the actor settings read from the keys."""

from __future__ import annotations

import pytest

from rlinf_ext.cli import main
from rlinf_ext.config import check_config, load_config
from rlinf_ext.training.settings import ActorSettings


def _issues(overrides):
    return {i.key: i for i in check_config("tiny-cpu", overrides).issues}


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (
            ["algorithm.off_policy.behaviour_weight_cap=0.9"],
            "algorithm.off_policy.behaviour_weight_cap",
            ("below 1", ">= 1"),
        ),
        (
            ["algorithm.off_policy.behaviour_weight_floor=1.5"],
            "algorithm.off_policy.behaviour_weight_floor",
            ("(0, 1]",),
        ),
        (["algorithm.off_policy.behaviour_weight_floor=0"], "algorithm.off_policy.behaviour_weight_floor", ("(0, 1]",)),
    ],
)
def test_behaviour_weight_range_is_checked(reference_env, overrides, key, words):
    issues = _issues(overrides)
    assert key in issues, [str(i) for i in issues.values()]
    text = f"{issues[key].reason} {issues[key].fix}"
    assert all(w in text for w in words), text


def test_edges_of_the_range_are_accepted(reference_env):
    ok = ["algorithm.off_policy.behaviour_weight_cap=1.0", "algorithm.off_policy.behaviour_weight_floor=1.0"]
    assert check_config("tiny-cpu", ok).ok
    assert "algorithm.off_policy.behaviour_weight" in _issues(["algorithm.off_policy.behaviour_weight=tis"])


def test_actor_settings_carry_the_off_policy_keys(reference_env):
    default = ActorSettings.from_config(load_config("tiny-cpu"), 1).loss
    assert (default.behaviour_weight, default.behaviour_weight_cap, default.behaviour_weight_floor) == (
        "truncate",
        2.0,
        0.5,
    )
    cfg = load_config(
        "tiny-cpu",
        [
            "algorithm.off_policy.behaviour_weight=mask",
            "algorithm.off_policy.behaviour_weight_cap=3",
            "algorithm.off_policy.behaviour_weight_floor=0.25",
        ],
    )
    settings = ActorSettings.from_config(cfg, 1)
    loss = settings.loss
    assert (loss.behaviour_weight, loss.behaviour_weight_cap, loss.behaviour_weight_floor) == ("mask", 3.0, 0.25)
    assert not settings.behaviour_required  # synchronous: a step without engine log-probs trains unweighted


@pytest.mark.parametrize("mode, required", [("truncate", True), ("none", False)])
def test_async_runs_require_engine_logprobs_unless_the_weight_is_off(reference_env, mode, required):
    cfg = load_config("tiny-cpu", [f"algorithm.off_policy.behaviour_weight={mode}"])
    cfg.runner.max_staleness = 1  # runner.max_staleness: the driver's key (set as the loaded config holds it)
    assert ActorSettings.from_config(cfg, 1).behaviour_required is required


STALE = ["runner.max_staleness=1", "rollout.return_logprobs=true"]
UNWEIGHTED = "algorithm.off_policy.behaviour_weight=none"


def test_stale_batches_without_a_behaviour_weight_are_warned_about(reference_env, capsys):
    """k > 0 with behaviour_weight none trains k-stale tokens against the proximal policy only (AReaL's loss without
    its correction: biased): validate accepts it, with a warning naming the key and the reason."""
    assert main(["validate", "tiny-cpu", *STALE, UNWEIGHTED]) == 0  # a warning, not a refusal
    err = capsys.readouterr().err
    assert "warning" in err and "algorithm.off_policy.behaviour_weight" in err, err
    checked = check_config("tiny-cpu", STALE + [UNWEIGHTED])
    assert checked.ok and not checked.issues
    [warning] = checked.warnings
    assert warning.key == "algorithm.off_policy.behaviour_weight" and warning.warning
    assert "runner.max_staleness=1" in warning.reason and "biased" in warning.reason
    assert "algorithm.off_policy.behaviour_weight=truncate" in warning.fix
    # a weight on, or a synchronous run: nothing to warn about
    assert not check_config("tiny-cpu", STALE).warnings
    assert not check_config("tiny-cpu", [UNWEIGHTED, "rollout.return_logprobs=true"]).warnings
