"""Learning you can see: the tiny experiments' main runs beside their controls, with one figure per world.

    python benchmarks/learning_bench.py [--worlds text,vl] [--seeds 1234,2] [--runs main,shuffled,ablated,titles]
                                        [--control-seeds 1234,2] [--out DIR] [--figures DIR] [--figure-tag TAG]
                                        [--analyse-only]

Text world (`tiny-cpu`, the registry world): `main` per seed; `shuffled` (``reward.shuffle_within_step``: the step's
rewards permuted before the advantage); `ablated` (the corpus without any asked pair: the search never returns the
gold pair); `ppo` per seed (PPO with the Megatron critic, ``algorithm.adv_type=gae``: the same steps and policy
learning rate as GRPO's) and its control `ppo_shuffled`. VL world (`tiny-mm-cpu`): `main` per seed; `shuffled`;
`ablated` (image search returns nothing usable); `titles` (the titles' cities permuted among the thumbnails, in train
and test caches).

Not a test: it measures. Each run is one `run_training` in a child process of its own (its output under
``--out``/<world>/<run>; an existing run with a metrics file is analysed, not rerun). Per run it reads metrics.jsonl
(reward, mixed groups, KL, the validation passes), the trajectories of every step (the answer shares) and, for the
text world, probes the converted model on the held-out questions (`assets/registry/probes.py`: sampled pass@1,
counterfactual-follow) beside the warm start's probes from the assets. It prints one table per world (markdown, for
docs/results.md) and draws ``--figures``/learning_<world><--figure-tag>.png: reward per step, held-out accuracy at the
validation steps, the stacked answer shares of the first main run, the share of mixed groups, the KL.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlinf_ext.protocol import metric_keys as mk  # noqa: E402

TEXT, VL = "text", "vl"
CONFIG = {TEXT: "tiny-cpu", VL: "tiny-mm-cpu"}
ANSWER_CLASSES = ("right", "other_candidate", "other", "gave_up")


@dataclass(frozen=True)
class Run:
    world: str
    name: str  # main-<seed> | ppo-<seed> | shuffled | ablated | titles | ppo_shuffled
    overrides: tuple[str, ...]
    seed: int


def seed_overrides(seed: int) -> list[str]:
    return [f"runner.seed={seed}", f"data.seed={seed}", f"actor.seed={seed}"]


PPO = ["algorithm.adv_type=gae", "critic.use_critic_model=true"]  # the Megatron critic on the text actor
PER_SEED_ARMS = {"main": [], "ppo": PPO}  # run on every seed; an FSDP2 VL actor has no critic: ppo is text only


def control_overrides(world: str, control: str) -> list[str] | None:
    """The YAML overrides of a control run (None: the world has no such control)."""
    if control == "ppo_shuffled":
        return [*PPO, "reward.shuffle_within_step=true"] if world == TEXT else None
    if control == "shuffled":
        return ["reward.shuffle_within_step=true"]
    if world == TEXT and control == "ablated":
        return [
            "retrieval.corpus_path=${paths.tiny_assets}/registry/corpus/wiki_ablated.jsonl",
            "retrieval.index_dir=${paths.tiny_assets}/registry/index/bm25_ablated",
        ]
    if world == VL and control in ("ablated", "titles"):
        suffix = {"ablated": "ablated", "titles": "titles_permuted"}[control]
        return [
            f"tools.image_search.cache_path=${{paths.tiny_assets}}/mm/image_search/tinymm_train_cache_{suffix}",
            f"tools.image_search.val_cache_path=${{paths.tiny_assets}}/mm/image_search/tinymm_test_cache_{suffix}",
        ]
    return None


def planned_runs(
    worlds: list[str], seeds: list[int], runs: list[str], control_seeds: list[int] | None = None
) -> list[Run]:
    """`main-<seed>` (and `ppo-<seed>`, text) per seed; each control on `control_seeds` (default: the first seed),
    named after the control on the first of them and `<control>-<seed>` on the others."""
    control_seeds = control_seeds or seeds[:1]
    out = []
    for world in worlds:
        for arm, extra in PER_SEED_ARMS.items():
            if arm in runs and (arm == "main" or world == TEXT):
                out += [Run(world, f"{arm}-{s}", tuple(seed_overrides(s) + extra), s) for s in seeds]
        for control in (r for r in runs if r not in PER_SEED_ARMS):
            overrides = control_overrides(world, control)
            if overrides is None:
                continue
            out += [
                Run(world, control if i == 0 else f"{control}-{s}", tuple(seed_overrides(s) + overrides), s)
                for i, s in enumerate(control_seeds)
            ]
    return out


# ------------------------------------------------------------------------------------------------ figures (pure)
def mixed_group_share(records: list[dict]) -> float:
    """Share of a step's groups (by uid) whose rewards are not all equal."""
    groups: dict[str, set] = defaultdict(set)
    for r in records:
        groups[r["uid"]].add(r["reward"])
    return sum(len(v) > 1 for v in groups.values()) / max(1, len(groups))


QUESTION_RE = re.compile(r"Question:\s*(.*?)\s*(?:<\|im_end\|>|$)", re.DOTALL)


def text_answer_shares(records: list[dict], world) -> dict[str, float]:
    """The step's answer shares in the registry world: right / another candidate of the subject's page / other /
    gave up (`assets/registry/probes.classify_answer`)."""
    from rlinf_ext.assets.registry.probes import classify_answer
    from rlinf_ext.rewards.qa_metrics import extract_answer

    by_text = {q.question: q for split in ("train", "heldout") for q in world.questions(split)}
    counts = Counter()
    for r in records:
        match = QUESTION_RE.search(r.get("prompt_text", ""))
        q = by_text.get(match.group(1).strip()) if match else None
        if q is None:
            continue
        counts[classify_answer(extract_answer(r["response_text"]), q, world.page_of(q.fact))] += 1
    n = max(1, sum(counts.values()))
    return {c: counts[c] / n for c in ANSWER_CLASSES}


def vl_answer_shares(records: list[dict]) -> dict[str, float]:
    """The step's search_required answers: right / another title's city (shown in the observation) / other."""
    from rlinf_ext.rewards.qa_metrics import extract_answer, normalize_answer

    counts = Counter()
    for r in records:
        if r.get("category") != "search_required":
            continue
        got = normalize_answer(extract_answer(r["response_text"]) or "")
        gold = {normalize_answer(a) for a in r["answers"]}
        shown = {normalize_answer(c) for c in re.findall(r"title: \w+ (\w+)", r["response_text"])}
        counts["right" if got in gold else "other_candidate" if got in shown else "other"] += 1
    n = max(1, sum(counts.values()))
    return {c: counts[c] / n for c in ("right", "other_candidate", "other")}


@dataclass
class RunFigures:
    run: Run
    steps: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    mixed: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    shares: list[dict[str, float]] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val: dict[str, list[float]] = field(default_factory=dict)  # metric -> values at val_steps
    probes_end: dict[str, float] = field(default_factory=dict)
    wall_s: float = float("nan")


def val_metrics(world: str) -> dict[str, str]:
    """label -> metrics.jsonl key of the held-out figures a world's validation logs."""
    if world == TEXT:
        return {"greedy EM": mk.VAL_ALL_EM}
    return {
        "search_required accuracy": mk.mm_category_metric("search_required", "accuracy", mk.VAL_PREFIX),
        "search_free accuracy": mk.mm_category_metric("search_free", "accuracy", mk.VAL_PREFIX),
        "search_free image search": mk.mm_category_metric("search_free", "search_ratio_image", mk.VAL_PREFIX),
    }


def read_run(run: Run, run_dir: Path, world_obj) -> RunFigures:
    from rlinf_ext.runner.metrics import METRICS_FILE, read_metrics

    figures = RunFigures(run)
    log_dir = next(run_dir.rglob(METRICS_FILE)).parent
    rows = read_metrics(log_dir / METRICS_FILE)
    keys = val_metrics(run.world)
    for row in rows:
        step = int(row["step"])
        if next(iter(keys.values())) in row:
            figures.val_steps.append(step)
            for label, key in keys.items():
                figures.val.setdefault(label, []).append(float(row.get(key, math.nan)))
        if step == 0 or mk.REWARD_MEAN not in row:
            continue
        figures.steps.append(step)
        figures.reward.append(float(row[mk.REWARD_MEAN]))
        # the KL to the reference where a KL term is on (actor/kl), else the policy's step-to-step approx_kl
        figures.kl.append(
            float(
                row.get(
                    mk.prefixed(mk.ACTOR_PREFIX, "kl"), row.get(mk.prefixed(mk.ACTOR_PREFIX, "approx_kl"), math.nan)
                )
            )
        )
        dump = run_dir / "trajectories" / f"step_{step}.jsonl"
        records = [json.loads(line) for line in dump.read_text().splitlines()] if dump.exists() else []
        figures.mixed.append(float(row.get(mk.REWARD_MIXED_GROUPS, mixed_group_share(records))))
        figures.shares.append(
            text_answer_shares(records, world_obj) if run.world == TEXT else vl_answer_shares(records)
        )
    timing = run_dir / "wall_time_s.txt"
    figures.wall_s = float(timing.read_text()) if timing.exists() else math.nan
    probes = run_dir / "probes_end.json"
    figures.probes_end = json.loads(probes.read_text()) if probes.exists() else {}
    return figures


def mean(values) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def table(world: str, figures: list[RunFigures], warm: dict[str, float]) -> str:
    """One markdown row per run: held-out accuracy first -> last validation (gain), the end probes, reward first
    vs last 10 steps, mixed groups, wall time."""
    label = next(iter(val_metrics(world)))
    head = ["run", f"held-out {label}, first -> last (gain)"]
    if world == TEXT:
        head += [
            "sampled pass@1 start -> end",
            "counterfactual-follow end",
            "answers right / other cand. / other / gave up, last 10 steps",
        ]
    else:
        head += [
            "search_free image search first -> last",
            "search_free accuracy last",
            "city answers right / other title / other, last 10 steps",
        ]
    head += ["reward first 10 -> last 10", "mixed groups, mean", "wall (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in figures:
        v = f.val.get(label, [math.nan])
        cells = [f.run.name, f"{v[0]:.3f} -> {v[-1]:.3f} ({v[-1] - v[0]:+.3f})"]
        last = {c: mean(s.get(c) for s in f.shares[-10:]) for c in (f.shares[-1] if f.shares else {})}
        if world == TEXT:
            cells += [
                f"{warm.get('pass@1', math.nan):.3f} -> {f.probes_end.get('pass@1', math.nan):.3f}",
                f"{f.probes_end.get('counterfactual_follow', math.nan):.3f}",
                " / ".join(f"{last.get(c, math.nan):.2f}" for c in ANSWER_CLASSES),
            ]
        else:
            img = f.val.get("search_free image search", [math.nan])
            acc = f.val.get("search_free accuracy", [math.nan])
            cells += [
                f"{img[0]:.3f} -> {img[-1]:.3f}",
                f"{acc[-1]:.3f}",
                " / ".join(f"{last.get(c, math.nan):.2f}" for c in ("right", "other_candidate", "other")),
            ]
        cells += [f"{mean(f.reward[:10]):.3f} -> {mean(f.reward[-10:]):.3f}", f"{mean(f.mixed):.2f}", f"{f.wall_s:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def draw(world: str, figures: list[RunFigures], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    label = next(iter(val_metrics(world)))
    for f in figures:
        style = {"main": "-", "ppo": "-."}.get(f.run.name.split("-")[0], "--")  # per-seed arms solid, controls dashed
        axes[0, 0].plot(f.steps, f.reward, style, label=f.run.name)
        axes[0, 1].plot(f.val_steps, f.val.get(label, []), style + "o", label=f"{f.run.name}, greedy")
        if world == TEXT and f.probes_end and f.steps:
            axes[0, 1].plot(
                [f.steps[-1]],
                [f.probes_end.get("pass@1", math.nan)],
                "x",
                markersize=9,
                label=f"{f.run.name}, sampled pass@1",
            )
        axes[1, 1].plot(f.steps, f.mixed, style, label=f.run.name)
        axes[1, 2].plot(f.steps, f.kl, style, label=f.run.name)
    main = next((f for f in figures if f.run.name.startswith("main")), None)
    if main is not None and main.shares:
        classes = list(main.shares[0])
        axes[0, 2].stackplot(main.steps, *[[s.get(c, 0.0) for s in main.shares] for c in classes], labels=classes)
        axes[0, 2].set_ylim(0, 1)
    if world == VL:
        for f in figures:
            axes[1, 0].plot(
                f.val_steps,
                f.val.get("search_free image search", []),
                "o-" if f.run.name.startswith("main") else "o--",
                label=f.run.name,
            )
        axes[1, 0].set_title("held-out search_free: image-search ratio (greedy)")
    else:
        for f in figures:
            axes[1, 0].plot(f.steps, [s.get("gave_up", math.nan) for s in f.shares], label=f.run.name)
        axes[1, 0].set_title("share of trajectories that give up")
    axes[0, 0].set_title("train reward per step")
    axes[0, 1].set_title(f"held-out {label}")
    axes[0, 2].set_title(f"answer shares per step ({main.run.name if main else ''})")
    axes[1, 1].set_title("groups with a non-zero advantage")
    axes[1, 2].set_title("KL (actor/kl, else the update's actor/approx_kl)")
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.suptitle(f"{CONFIG[world]}: main runs and controls ({'registry world' if world == TEXT else 'emblem world'})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ one run
def run_one(run_json: str) -> int:
    """The child's side: one run_training (no evaluation pass: validation covers the held-out split), then the
    text world's probes of the trained model."""
    spec = json.loads(run_json)
    out = Path(spec["out"])
    from rlinf_ext.runner.launch import run_training

    started = time.monotonic()
    summary = run_training(
        CONFIG[spec["world"]],
        [
            *spec["overrides"],
            f"runner.output_dir={out}",
            f"runner.experiment_name={spec['name']}",
            f"runner.rollout_data_dir={out / 'trajectories'}",
        ],
        show_progress=False,
        evaluate=False,
    )
    (out / "wall_time_s.txt").write_text(f"{time.monotonic() - started:.1f}\n")
    if spec["world"] == TEXT and summary.hf_model_dir is not None:
        (out / "probes_end.json").write_text(json.dumps(text_probes(summary.hf_model_dir, spec["assets"])))
    return 0


def text_probes(model_dir: Path, assets: str) -> dict[str, float]:
    """`probes.probe_all` of a model on the registry world's held-out questions."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlinf_ext.assets.core.search import LexicalRetriever
    from rlinf_ext.assets.registry.probes import probe_all
    from rlinf_ext.assets.registry.world import HELDOUT, build_registry_world

    world = build_registry_world(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return probe_all(
        model, tokenizer, world, world.questions(HELDOUT), LexicalRetriever([p.contents for p in world.pages])
    )


def assets_dir() -> Path:
    return Path(os.environ.get("RLINF_EXT_TINY_ASSETS") or REPO / "outputs" / "tiny_assets")


def warm_figures(world: str) -> dict[str, float]:
    if world != TEXT:
        return {}
    report = assets_dir() / "registry" / "report.json"
    return json.loads(report.read_text())["heldout"] if report.exists() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="text,vl")
    parser.add_argument("--seeds", default="1234,2")
    parser.add_argument("--runs", default="main,shuffled,ablated,titles")
    parser.add_argument("--control-seeds", default="", help="seeds of the control runs (default: the first of --seeds)")
    parser.add_argument("--out", default=str(REPO / "outputs" / "learning_bench"))
    parser.add_argument("--figures", default=str(REPO / "docs"))
    parser.add_argument("--figure-tag", default="", help="appended to the figure's name: learning_<world><TAG>.png")
    parser.add_argument("--analyse-only", action="store_true", help="read the runs under --out, start none")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one:
        return run_one(args.run_one)
    worlds = [w for w in args.worlds.split(",") if w]
    runs = planned_runs(
        worlds,
        [int(s) for s in args.seeds.split(",")],
        args.runs.split(","),
        [int(s) for s in args.control_seeds.split(",") if s],
    )
    out = Path(args.out)
    for run in runs:
        run_dir = out / run.world / run.name
        if args.analyse_only or (run_dir / "wall_time_s.txt").exists():
            continue
        spec = json.dumps(
            {
                "world": run.world,
                "name": run.name,
                "overrides": list(run.overrides),
                "out": str(run_dir),
                "assets": str(assets_dir()),
            }
        )
        print(f"\n===== {run.world}/{run.name}: {' '.join(run.overrides)}", flush=True)
        code = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--run-one", spec], cwd=str(REPO)
        ).returncode
        if code != 0:
            print(f"{run.world}/{run.name} failed (exit {code}); its output is above", file=sys.stderr)
            return code
    for world in worlds:
        from rlinf_ext.assets.registry.world import build_registry_world

        world_obj = build_registry_world(0) if world == TEXT else None
        figures = [
            read_run(r, out / r.world / r.name, world_obj)
            for r in runs
            if r.world == world and (out / r.world / r.name).exists()
        ]
        if not figures:
            continue
        print(
            f"\n{CONFIG[world]} ({world} world), held-out questions only:\n{table(world, figures, warm_figures(world))}"
        )
        figure = Path(args.figures) / f"learning_{world}{args.figure_tag}.png"
        draw(world, figures, figure)
        print(f"figure: {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
