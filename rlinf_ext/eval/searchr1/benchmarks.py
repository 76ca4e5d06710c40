"""The seven Search-R1 benchmarks: canonical names, display names and the paper's column order."""

from __future__ import annotations

from pathlib import Path

# Canonical name -> display name, in the order of the Search-R1 paper's results table.
PAPER_ORDER: tuple[str, ...] = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
DISPLAY_NAMES: dict[str, str] = {
    "nq": "NQ",
    "triviaqa": "TriviaQA",
    "popqa": "PopQA",
    "hotpotqa": "HotpotQA",
    "2wikimultihopqa": "2Wiki",
    "musique": "MuSiQue",
    "bamboogle": "Bamboogle",
}

# Spellings seen in the peers' data_source fields and file names.
_ALIASES: dict[str, str] = {
    "natural_questions": "nq",
    "naturalquestions": "nq",
    "nq_search": "nq",
    "trivia_qa": "triviaqa",
    "tqa": "triviaqa",
    "pop_qa": "popqa",
    "hotpot_qa": "hotpotqa",
    "hotpot": "hotpotqa",
    "2wiki": "2wikimultihopqa",
    "2wikimultihop": "2wikimultihopqa",
    "2wiki_multihop_qa": "2wikimultihopqa",
    "wikimultihopqa": "2wikimultihopqa",
    "musique_ans": "musique",
}


def canonical_benchmark(name: str) -> str | None:
    """The canonical benchmark name for a data_source / file stem, or None if it is not one of the seven."""
    key = name.strip().lower().replace("-", "_")
    for prefix in ("searchr1_", "search_r1_"):
        key = key.removeprefix(prefix)
    if key in DISPLAY_NAMES:
        return key
    return _ALIASES.get(key) or _ALIASES.get(key.replace("_", ""))


def benchmark_from_path(path: str | Path) -> str:
    """Benchmark name for a file: canonical if the stem names a benchmark, else the stem itself."""
    stem = Path(path).name.split(".")[0]
    return canonical_benchmark(stem) or stem


def display_name(bench: str) -> str:
    return DISPLAY_NAMES.get(bench, bench)


def paper_sorted(benchmarks) -> list[str]:
    """Benchmarks in the paper's order; others keep their first-seen order after the seven."""
    seen = list(dict.fromkeys(benchmarks))
    known = [b for b in PAPER_ORDER if b in seen]
    return known + [b for b in seen if b not in DISPLAY_NAMES]
