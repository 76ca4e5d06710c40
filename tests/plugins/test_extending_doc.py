"""docs/extending.md shows every file of the worked examples under examples/plugins/ in full, as it is: a block
introduced by "(`<path>`, in full)" equals that file byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHOWN = re.compile(r"\(`(examples/plugins/[^`]+)`, in full\)[^\n]*\n(?:[^\n]+\n)*\n```\w+\n(.*?)^```$", re.S | re.M)


def test_every_worked_example_file_is_shown_in_full_and_unchanged():
    shown = dict(SHOWN.findall((REPO / "docs" / "extending.md").read_text()))
    files = {
        str(p.relative_to(REPO))
        for p in (REPO / "examples" / "plugins").rglob("*")
        if p.is_file() and p.suffix in (".py", ".yaml")
    }
    assert set(shown) == files, f"shown in full: {sorted(shown)}; files: {sorted(files)}"
    drifted = [rel for rel, text in shown.items() if text != (REPO / rel).read_text()]
    assert not drifted, f"docs/extending.md differs from {drifted}: paste the files again"
