"""Thin entry point: `python launchers/train.py CONFIG [key=value ...]` == `rlinf-ext train CONFIG ...`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # works from a clone without `pip install -e .`

from rlinf_ext.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
