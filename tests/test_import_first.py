"""Every module of the package imports first, alone (``tests/support/import_first.py``): an import cycle through a
package's ``__init__`` fails here the way it fails for a user's first import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # one interpreter per module of the package (~85 s on 2 cores)

HERE = Path(__file__).resolve().parent


def run_import_first(root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, str(HERE / "support" / "import_first.py"), str(os.cpu_count() or 2)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_module_imports_first_alone():
    report = run_import_first(HERE.parent)
    assert report["modules"] > 100
    assert not report["failures"], "modules that fail when imported first:\n" + "\n".join(
        f"{m}:\n{e}" for m, e in report["failures"].items()
    )
