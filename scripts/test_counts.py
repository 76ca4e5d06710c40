"""How many tests each tier holds, from pytest's own collection (documents name this script instead of typing counts).

    python scripts/test_counts.py [PYTEST ARGS...]

Runs ``pytest --collect-only -q`` once per tier -- all, the quick tier (``-m "not slow"``) and the slow tests --
and prints one line per tier, then the tests per top-level test folder of the whole suite.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIERS = (("all", None), ("quick", "not slow"), ("slow", "slow"))


def collected_ids(output: str) -> list[str]:
    """The test ids ``pytest --collect-only -q`` printed, one per line (``path::name[params]``), in order; a
    durations line (``0.01s setup path::name``) has a space before its ``::``."""
    return [line for line in output.splitlines() if "::" in line and " " not in line.split("::", 1)[0]]


def folder_of(test_id: str) -> str:
    """``tests/config/test_rules.py::test_x`` -> ``tests/config``; a file at the top -> ``tests``."""
    path = Path(test_id.split("::", 1)[0])
    return str(path.parent) if len(path.parts) > 1 else "."


def collect(marker: str | None, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra]
    if marker is not None:
        cmd += ["-m", marker]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 5):  # 5: nothing collected
        raise SystemExit(f"pytest collection failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return collected_ids(proc.stdout)


def main(argv: list[str]) -> None:
    every: list[str] = []
    for name, marker in TIERS:
        ids = collect(marker, argv)
        every = ids if marker is None else every
        print(f"{name:<6} {len(ids):>5} tests" + (f'  (-m "{marker}")' if marker else ""))
    print()
    for folder, n in sorted(Counter(folder_of(i) for i in every).items()):
        print(f"  {folder:<24} {n:>5}")


if __name__ == "__main__":
    main(sys.argv[1:])
