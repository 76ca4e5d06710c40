"""End to end: PPO with the Megatron critic through the real launcher (``rlinf-ext train tiny-cpu
algorithm.adv_type=gae critic.use_critic_model=true``), three steps on the fallback engine, the first of them the
critic's warm-up, stopped by SIGTERM once step 1 is logged and resumed with ``runner.resume_dir=auto``. Every step
logs the critic's metrics; the warm-up step leaves the policy alone; the SIGTERM checkpoint holds the critic beside
the actor, the resume restores it from there, and the final checkpoint holds it again."""

from __future__ import annotations

import math
import signal

import pytest
from launch_helpers import CI_SIZE, launch, metrics_rows, when_step_logged

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.runner.checkpoints import check_complete, latest_complete_checkpoint
from rlinf_ext.runner.commands import EXIT_PREEMPTED
from rlinf_ext.workers.actor import CRITIC_DIR

pytestmark = pytest.mark.slow

STEPS = 3  # SIGTERM once step 1 is logged stops after step 2 at the latest: the resume trains step 3 at least
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
def test_tiny_ppo_run_trains_the_critic_and_the_policy_and_resumes_the_critic_after_sigterm(tiny_assets, tmp_path):
    run_dir = tmp_path / "searchr1-grpo-tiny-cpu"
    args = ["--no-eval", f"paths.tiny_assets={tiny_assets.root}", f"runner.output_dir={tmp_path}", *ARGS]
    launcher = {}
    done = when_step_logged(run_dir, 1, lambda: launcher["proc"].send_signal(signal.SIGTERM))
    code, log = launch(args, on_line=lambda _line, proc: launcher.setdefault("proc", proc), timeout=220)
    done.set()
    assert code == EXIT_PREEMPTED, log[-4000:]
    stopped = latest_complete_checkpoint(run_dir / "checkpoints")  # the step in flight finished and was saved
    assert stopped is not None and check_complete(stopped) is None, log[-4000:]
    last = int(stopped.name.rsplit("_", 1)[1])
    assert 1 <= last < STEPS and (stopped / "actor").is_dir() and (stopped / CRITIC_DIR).is_dir()

    code, resume_log = launch([*args, "runner.resume_dir=auto"], timeout=220)
    assert code == 0, resume_log[-4000:]
    assert f"resumed from {stopped}" in resume_log
    assert f"critic restored from {stopped / CRITIC_DIR} (iteration {last})" in resume_log

    rows = [r for r in metrics_rows(run_dir) if mk.REWARD_MEAN in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), resume_log[-4000:]
    for row in rows:
        for key in mk.CRITIC_METRICS:
            assert key in row, (key, sorted(row))
        assert math.isfinite(row[mk.CRITIC_VALUE_LOSS]) and 0.0 <= row[mk.CRITIC_VALUE_CLIP_FRAC] <= 1.0
    # step 1 is the critic's warm-up: no policy update; afterwards, resumed steps included, one per mini-batch
    assert rows[0][mk.ACTOR_OPTIMIZER_STEPS] == 0 and mk.ACTOR_LOSS not in rows[0]
    assert all(r[mk.ACTOR_OPTIMIZER_STEPS] == 1 and math.isfinite(r[mk.ACTOR_LOSS]) for r in rows[1:])
    final = latest_complete_checkpoint(run_dir / "checkpoints")
    assert final == run_dir / "checkpoints" / f"global_step_{STEPS}"
    assert (final / "actor").is_dir() and (final / CRITIC_DIR).is_dir()
