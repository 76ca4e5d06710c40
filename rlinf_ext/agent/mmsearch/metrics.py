"""Reward and metrics of MMSearch-R1 trajectories (metric names are constants, one place)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlinf_ext.agent.mmsearch.reward import mmsearch_score
from rlinf_ext.agent.mmsearch.types import VLTrajectory
from rlinf_ext.protocol import metric_keys as mk

ACCURACY, REWARD = "accuracy", "reward"
IMAGE_SEARCH_RATIO, TEXT_SEARCH_RATIO, MIX_SEARCH_RATIO = "search_ratio_image", "search_ratio_text", "search_ratio_mix"
ANY_SEARCH_RATIO = "search_ratio_any"
IMAGE_FAILURE_RATIO, TEXT_FAILURE_RATIO = "image_search_failure_ratio", "text_search_failure_ratio"
CATEGORIES = ("search_required", "search_free")  # FVQA's split: does the question need a search?
ALL = "all"
TABLE_COLUMNS = (
    ACCURACY,
    REWARD,
    IMAGE_SEARCH_RATIO,
    TEXT_SEARCH_RATIO,
    MIX_SEARCH_RATIO,
    ANY_SEARCH_RATIO,
    IMAGE_FAILURE_RATIO,
    TEXT_FAILURE_RATIO,
)


def reward_fn(reward_cfg: Any, step: int = 0, shaping: Any = None) -> Callable[[VLTrajectory], float]:
    """`fn(trajectory) -> score` on the model's own turn texts (`shaping`: `agentloop.mmsearch.reward`); the
    details stay on the trajectory."""

    def score(trajectory: VLTrajectory) -> float:
        result = mmsearch_score(
            [t.text for t in trajectory.turns], trajectory.answers, reward_cfg, step=step, shaping=shaping
        )
        trajectory.reward_details = result
        return result.score

    return score


def search_kind(image_searches: float, text_searches: float) -> str:
    """none | image | text | mix, by the searches that actually ran."""
    if image_searches and text_searches:
        return "mix"
    return "image" if image_searches else "text" if text_searches else "none"


def table_summary(rows: Sequence[dict]) -> dict[str, float]:
    """Table metrics over rows `{correct, reward, image_searches, text_searches, image_search_failures,
    text_search_failures}` (one per trajectory): accuracy, mean reward, share of trajectories by search kind,
    and failed searches per search."""
    n = len(rows)
    if not n:
        return {}
    kinds = [search_kind(r["image_searches"], r["text_searches"]) for r in rows]
    images = sum(r["image_searches"] for r in rows)
    texts = sum(r["text_searches"] for r in rows)
    return {
        ACCURACY: sum(float(r["correct"]) for r in rows) / n,
        REWARD: sum(float(r["reward"]) for r in rows) / n,
        IMAGE_SEARCH_RATIO: kinds.count("image") / n,
        TEXT_SEARCH_RATIO: kinds.count("text") / n,
        MIX_SEARCH_RATIO: kinds.count("mix") / n,
        ANY_SEARCH_RATIO: (n - kinds.count("none")) / n,
        IMAGE_FAILURE_RATIO: sum(r["image_search_failures"] for r in rows) / images if images else 0.0,
        TEXT_FAILURE_RATIO: sum(r["text_search_failures"] for r in rows) / texts if texts else 0.0,
    }


def summary_by_category(rows: Sequence[dict], prefix: str = "") -> dict[str, float]:
    """``table_summary`` of all rows and of each ``row["category"]`` (``search_required`` / ``search_free``, and any
    other category present), keyed ``[prefix/]<category>/<metric>``: the paper's claim is read per category
    (fewer searches on ``search_free``, accuracy held on ``search_required``)."""
    head = f"{prefix}/" if prefix else ""
    out = {f"{head}{ALL}/{k}": v for k, v in table_summary(rows).items()}
    for category in sorted({str(r["category"]) for r in rows}):
        part = [r for r in rows if str(r["category"]) == category]
        out.update({f"{head}{category}/{k}": v for k, v in table_summary(part).items()})
    return out


def reward_rows(result: Any, details: Sequence[Any]) -> list[dict]:
    """Per-trajectory rows of ``table_summary`` from one scored group (category, correctness, searches that ran)."""
    rows = []
    for i, res in enumerate(details):
        m = result.trajectory_metrics[i]
        rows.append(
            {
                "category": result.categories[i],
                "correct": float(res.correct),
                "reward": float(res.score),
                **{
                    k: float(m.get(k, 0.0))
                    for k in ("image_searches", "text_searches", "image_search_failures", "text_search_failures")
                },
            }
        )
    return rows


def reward_metrics(scored: Sequence[tuple[Any, Sequence[Any]]]) -> dict[str, float]:
    """``AgentSpec.reward_metrics``: the table metrics of a reward step's groups, per FVQA category."""
    rows = [row for result, details in scored for row in reward_rows(result, details)]
    return summary_by_category(rows, prefix=mk.ROLLOUT_PREFIX)
