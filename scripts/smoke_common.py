"""What the stages of scripts/gpu_smoke.py share: the Ray / ``rlinf.scheduler`` stubs, the per-stage record, and
the small random inputs (run one stage per process by ``gpu_smoke.py --run-stage SN``; see its docstring).

Each stage function fills a ``Record`` (checks that decide pass/fail, figures that are reported) and may raise
``SkipStage`` when this machine lacks what it needs. Ray and ``rlinf.scheduler`` are replaced by stubs before
anything imports them (``install_stubs``): only ``rlinf.algorithms`` of RLinf is used here, and RLinf's utility
module imports its scheduler (and Ray) at the top.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import time
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------ stubs
class _StubModule(types.ModuleType):
    """Any attribute is a do-nothing class (RLinf's modules subclass ``Worker`` etc. at import time)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {"__init__": lambda self, *a, **k: None, "__module__": self.__name__})
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    PREFIXES = ("ray", "rlinf.scheduler")

    def find_spec(self, name, path, target=None):
        if any(name == p or name.startswith(p + ".") for p in self.PREFIXES):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


def install_stubs() -> None:
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())


# ------------------------------------------------------------------------------------------ records
class SkipStage(Exception):
    """The machine lacks what the stage needs (the message says what)."""


@dataclass
class Record:
    checks: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)  # check name -> why this machine cannot run it

    def check(self, name: str, ok) -> bool:
        self.checks[name] = bool(ok)
        return bool(ok)

    def figure(self, name: str, value) -> None:
        self.figures[name] = value

    def skip(self, name: str, reason: str) -> None:
        self.skipped[name] = reason


@dataclass
class Context:
    device: str  # "cuda" | "cpu"
    work: Path

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def torch_device(self):
        import torch

        return torch.device("cuda", 0) if self.cuda else torch.device("cpu")

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()


def run_stage(stage: str, title: str, function, args, *, stubs: bool = True) -> int:
    """Run ``function(record, context)`` and append the stage's JSON line to OUT/results.jsonl. ``stubs``: Ray and
    ``rlinf.scheduler`` stubbed first (off for vLLM, which reads ``ray.is_initialized()`` and would take a stub's
    answer for a running Ray)."""
    if stubs:
        install_stubs()
    ctx = Context(args.device, Path(args.work))
    rec, status, error = Record(), "pass", None
    start = time.perf_counter()
    try:
        function(rec, ctx)
        if not all(rec.checks.values()):
            status = "fail"
    except SkipStage as exc:
        status, error = "skipped", str(exc)
    except BaseException as exc:  # noqa: BLE001 - any failure is the stage's result
        status, error = "fail", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
    line = {
        "stage": stage,
        "title": title,
        "status": status,
        "seconds": round(time.perf_counter() - start, 1),
        "device": args.device,
        "checks": rec.checks,
        "skipped": rec.skipped,
        "figures": rec.figures,
        "error": error,
    }
    with (Path(args.out) / "results.jsonl").open("a") as f:
        f.write(json.dumps(line, default=str) + "\n")
    return 0


# ------------------------------------------------------------------------------------------ shared inputs
def init_parallel(seed: int = 0) -> None:
    from megatron.core import parallel_state

    from rlinf_ext.models.cpu_shims import init_parallel_state

    if not parallel_state.model_parallel_is_initialized():
        init_parallel_state(1, 1, seed=seed)  # nccl world size 1 on CUDA, gloo on CPU


def tiny_model_dir(ctx: Context) -> Path:
    """A tiny random Qwen2 (the test model's shape) with every weight N(0, 0.05) around its init, so that a
    swapped bias or norm changes the output; written once per work directory."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlinf_ext.assets.core.random_qwen2 import write_random_qwen2

    out = ctx.work / "qwen2-tiny-random"
    if (out / "config.json").is_file():
        return out
    write_random_qwen2(out, "tiny", seed=0)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if name.endswith("norm.weight") else 0.0) + 0.05 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def hf_model(model_dir: Path, ctx: Context, dtype):
    from transformers import AutoModelForCausalLM

    return (
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
        .to(ctx.torch_device)
        .eval()
    )


def actor_samples(vocab: int, n: int = 4, prompt: int = 6, response: int = 10, seed: int = 0):
    import torch

    from rlinf_ext.training.grpo_policy import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        mask = [1] * response
        mask[3:5] = [0, 0]  # an observation inside the response
        out.append(
            Sample(
                torch.randint(3, vocab, (prompt + i,), generator=g).tolist(),
                torch.randint(3, vocab, (response,), generator=g).tolist(),
                mask,
                reward=float(i % 2),
            )
        )
    return out


def max_abs(a, b, mask=None) -> float:
    diff = (a.float() - b.float()).abs()
    if mask is not None:
        diff = diff[mask.bool()]
    return float(diff.max())
