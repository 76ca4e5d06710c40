"""End to end: PPO with the Megatron critic through the real launcher (``rlinf-ext train tiny-cpu
algorithm.adv_type=gae critic.use_critic_model=true``), four steps on the fallback engine, the first of them the
critic's warm-up. Every step logs the critic's metrics; the warm-up step leaves the policy alone; the final
checkpoint holds the critic beside the actor. The critic's resume (from the same checkpoint the SIGTERM path
writes, tests/e2e/test_tiny_experiment_hf.py) is checked for exactness on the runner:
tests/runner/test_trainer_cpu.py (3 steps == 2 steps + resume + 1, value loss included)."""

from __future__ import annotations

import math

import pytest
from launch_helpers import CI_SIZE, launch, metrics_rows

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.checkpoints import latest_complete_checkpoint
from rlinf_ext.workers.actor import CRITIC_DIR

pytestmark = pytest.mark.slow

STEPS = 4
ARGS = [a for a in CI_SIZE if not a.startswith("runner.save_interval=")] + [
    "runner.save_interval=-1",
    "rollout.rollout_backend=hf",
    f"runner.max_steps={STEPS}",
    "runner.val_before_train=false",
    "runner.val_check_interval=0",
    "algorithm.adv_type=gae",
    "critic.use_critic_model=true",
    "critic.critic_warmup=1",
    "critic.optim.lr=1e-3",
]


@pytest.mark.timeout(480)
def test_four_tiny_ppo_steps_train_the_critic_and_then_the_policy(tiny_assets, tmp_path):
    run_dir = tmp_path / "searchr1-grpo-tiny-cpu"
    args = ["--no-eval", f"paths.tiny_assets={tiny_assets.root}", f"runner.output_dir={tmp_path}", *ARGS]
    code, log = launch(args, timeout=300)
    assert code == 0, log[-4000:]

    rows = [r for r in metrics_rows(run_dir) if mk.REWARD_MEAN in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), log[-4000:]
    for row in rows:
        for key in mk.CRITIC_METRICS:
            assert key in row, (key, sorted(row))
        assert math.isfinite(row[mk.CRITIC_VALUE_LOSS]) and 0.0 <= row[mk.CRITIC_VALUE_CLIP_FRAC] <= 1.0
    # step 1 is the critic's warm-up: no policy update; afterwards one per mini-batch
    assert rows[0][mk.ACTOR_OPTIMIZER_STEPS] == 0 and mk.ACTOR_LOSS not in rows[0]
    assert all(r[mk.ACTOR_OPTIMIZER_STEPS] == 1 and math.isfinite(r[mk.ACTOR_LOSS]) for r in rows[1:])
    final = latest_complete_checkpoint(run_dir / "checkpoints")
    assert final == run_dir / "checkpoints" / f"global_step_{STEPS}"
    assert (final / "actor").is_dir() and (final / CRITIC_DIR).is_dir()
