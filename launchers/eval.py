"""Thin entry point: `python launchers/eval.py CONFIG [key=value ...]` == `rlinf-ext eval CONFIG ...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # works from a clone without `pip install -e .`

from rlinf_ext.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["eval", *sys.argv[1:]]))
