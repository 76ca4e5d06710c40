"""MMSearch-R1's lines of the run summary (``AgentSpec.summary``): accuracy and image-search ratio per FVQA category
at every validation pass, read from the run's metrics rows (``val/<category>/<column>``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlinf_ext.agent.mmsearch.metrics import ACCURACY, ALL, IMAGE_SEARCH_RATIO
from rlinf_ext.protocol import metric_keys as mk


@dataclass(frozen=True)
class ValidationPoint:
    """One validation pass: category -> accuracy and -> image-search ratio ('all' first)."""

    step: int
    accuracy: dict[str, float]
    image_search: dict[str, float]
    n: int

    def format(self) -> str:
        def cells(values: dict[str, float]) -> str:
            return ", ".join(f"{c} {v:.3f}" for c, v in values.items())

        return f"step {self.step}: accuracy {cells(self.accuracy)}; image-search ratio {cells(self.image_search)}"


def _category_values(row: dict, categories: list[str], column: str) -> dict[str, float]:
    keys = {c: mk.mm_category_metric(c, column, mk.VAL_PREFIX) for c in categories}
    return {c: float(row[k]) for c, k in keys.items() if k in row}


def validation_trend(rows: Sequence[dict]) -> list[ValidationPoint]:
    """Every validation pass among ``rows`` (those with ``val/<category>/accuracy``), in their order: accuracy and
    image-search ratio per category, 'all' first, then the categories by name."""
    points = []
    for row in rows:
        found = {k.split("/")[1] for k in row if k.startswith(f"{mk.VAL_PREFIX}/") and k.endswith(f"/{ACCURACY}")}
        categories = sorted(found, key=lambda c: (c != ALL, c))
        if categories:
            points.append(
                ValidationPoint(
                    int(row["step"]),
                    _category_values(row, categories, ACCURACY),
                    _category_values(row, categories, IMAGE_SEARCH_RATIO),
                    int(row.get(mk.VAL_N, 0)),
                )
            )
    return points


def summary_lines(rows: Sequence[dict]) -> list[str]:
    """The run summary's lines: a header and one line per validation pass (none without a pass)."""
    points = validation_trend(rows)
    if not points:
        return []
    return [
        f"validation accuracy per category (greedy, {points[-1].n} test questions):",
        *(f"  {point.format()}" for point in points),
    ]
