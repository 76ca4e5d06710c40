"""What the side-by-side experiment benchmarks share (``tiny_experiment_bench.py``, ``mm_tiny_experiment_bench.py``):
the ``--backends`` list, a fresh output directory, and one child process per engine that writes its figures as
JSON (an in-process vLLM engine cannot start beside the numba the asset generator loads, and vLLM's Transformers
backend changes transformers' Qwen2.5-VL classes in its process)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def engine_run_parser(description: str, default_backends: str) -> argparse.ArgumentParser:
    """The options both benchmarks take, with the hidden ones of their per-engine child processes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--backends",
        default=default_backends,
        help=f"rollout engines, comma-separated (vllm, hf; default {default_backends})",
    )
    parser.add_argument("--assets", help="tiny assets directory (default $RLINF_EXT_TINY_ASSETS, else under --out)")
    parser.add_argument("--out", help="output root (default: a fresh temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary output directory")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)  # child: run this engine, write --result
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser


def build_assets(root: Path, *flags: str) -> float:
    """``rlinf-ext make-tiny-assets --out ROOT FLAGS`` in a child process (the generator loads numba); seconds."""
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "rlinf_ext.cli", "make-tiny-assets", "--out", str(root), *flags],
        check=True,
        cwd=str(REPO),
    )
    return time.monotonic() - started


def parse_backends(text: str, known: Sequence[str]) -> list[str] | None:
    """``vllm,hf`` -> ["vllm", "hf"]; None (after saying why) when empty, unknown or repeated."""
    backends = [b.strip() for b in text.split(",") if b.strip()]
    if not backends or any(b not in known for b in backends) or len(set(backends)) != len(backends):
        print(f"--backends {text}: give distinct engines among {', '.join(known)}", file=sys.stderr)
        return None
    return backends


def fresh_out_dir(out: str | None, prefix: str) -> Path | None:
    """``out`` (or a new temporary directory); None (after saying why) when it holds earlier runs."""
    path = Path(out) if out else Path(tempfile.mkdtemp(prefix=prefix))
    if path.exists() and any(p.name != "assets" for p in path.iterdir()):
        print(
            f"--out {path} holds earlier runs; give an empty or new directory (a run there would resume)",
            file=sys.stderr,
        )
        return None
    return path


def run_engines(
    script: Path, backends: Sequence[str], out: Path, child_args: Callable[[str, Path], list[str]]
) -> dict[str, dict] | int:
    """``python SCRIPT --run-one B --result OUT/B.json *child_args(B, OUT/B)`` for each engine in turn; their
    figures by engine, or the exit code of the first that failed."""
    figures: dict[str, dict] = {}
    for backend in backends:
        result = out / f"{backend}.json"
        command = [
            sys.executable,
            str(script),
            "--run-one",
            backend,
            "--result",
            str(result),
            *child_args(backend, out / backend),
        ]
        print(f"\n===== {backend}: {' '.join(command[1:])}", flush=True)
        code = subprocess.run(command, cwd=str(REPO)).returncode
        if code != 0:
            print(f"the run on {backend} failed (exit {code}); its output is above", file=sys.stderr)
            return code
        figures[backend] = json.loads(result.read_text())
    return figures
