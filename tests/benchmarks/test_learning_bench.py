"""benchmarks/learning_bench.py's pure parts: which runs it plans, with which overrides, and its table."""

from __future__ import annotations

from tests.support.script_modules import load_script


def load_bench():
    return load_script("benchmarks/learning_bench.py")


def test_main_runs_per_seed_and_each_world_only_its_own_controls():
    bench = load_bench()
    runs = bench.planned_runs(["text", "vl"], [1234, 2], ["main", "shuffled", "ablated", "titles"])
    names = [(r.world, r.name) for r in runs]
    assert names == [
        ("text", "main-1234"),
        ("text", "main-2"),
        ("text", "shuffled"),
        ("text", "ablated"),
        ("vl", "main-1234"),
        ("vl", "main-2"),
        ("vl", "shuffled"),
        ("vl", "ablated"),
        ("vl", "titles"),
    ]
    shuffled = next(r for r in runs if r.name == "shuffled")
    assert "reward.shuffle_within_step=true" in shuffled.overrides and "runner.seed=1234" in shuffled.overrides
    text_ablated = next(r for r in runs if (r.world, r.name) == ("text", "ablated"))
    assert any("wiki_ablated.jsonl" in o for o in text_ablated.overrides)
    titles = next(r for r in runs if r.name == "titles")
    assert any(o.endswith("tinymm_test_cache_titles_permuted") for o in titles.overrides)


def test_controls_on_several_seeds_are_told_apart():
    bench = load_bench()
    runs = bench.planned_runs(["text"], [1234], ["shuffled"], control_seeds=[1234, 2])
    assert [(r.name, r.seed) for r in runs] == [("shuffled", 1234), ("shuffled-2", 2)]
    assert "runner.seed=2" in runs[1].overrides


def test_ppo_runs_per_seed_with_its_own_control_in_the_text_world_only():
    bench = load_bench()
    runs = bench.planned_runs(["text", "vl"], [1234, 2], ["main", "ppo", "ppo_shuffled"])
    assert [(r.world, r.name) for r in runs] == [
        ("text", "main-1234"),
        ("text", "main-2"),
        ("text", "ppo-1234"),
        ("text", "ppo-2"),
        ("text", "ppo_shuffled"),
        ("vl", "main-1234"),
        ("vl", "main-2"),
    ]
    ppo = {r.name: r for r in runs if r.world == "text"}
    for name in ("ppo-2", "ppo_shuffled"):
        assert {"algorithm.adv_type=gae", "critic.use_critic_model=true"} <= set(ppo[name].overrides)
    assert "reward.shuffle_within_step=true" in ppo["ppo_shuffled"].overrides
    assert "reward.shuffle_within_step=true" not in ppo["ppo-2"].overrides and "runner.seed=2" in ppo["ppo-2"].overrides
    assert not any("adv_type" in o for o in ppo["main-2"].overrides)


def test_the_table_reads_first_and_last_validation():
    bench = load_bench()
    figures = bench.RunFigures(bench.Run("text", "main-1", (), 1))
    figures.val = {"greedy EM": [0.0, 0.5, 0.9]}
    figures.reward, figures.mixed, figures.wall_s = [0.1] * 3, [0.5, 1.0], 120.0
    row = bench.table("text", [figures], {"pass@1": 0.15}).splitlines()[2]
    assert row.startswith("| main-1 | 0.000 -> 0.900 (+0.900) | 0.150 -> nan")
    assert row.endswith("| 0.100 -> 0.100 | 0.75 | 120 |")
