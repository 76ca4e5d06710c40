"""scripts/check_gpu_extras.py without the network: each profile names setup.py pins that exist, and the check of a
resolution (pip's report, here hand-built) flags a wrong version, a forbidden package and a pin outside its range.
The dry run itself needs PyPI (`python scripts/check_gpu_extras.py --profile sglang`, a few minutes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_gpu_extras", REPO / "scripts" / "check_gpu_extras.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_profiles_name_setup_pins():
    pins = check.setup_constants("GPU_REQUIREMENTS", "SGLANG_REQUIREMENTS", "SGLANG_TORCH_REQUIREMENT", "TORCH_RANGE")
    assert set(check.PROFILES) == {"vllm", "sglang"}
    assert "sglang==0.5.23" in pins["SGLANG_REQUIREMENTS"] and pins["SGLANG_TORCH_REQUIREMENT"] == "torch==2.14.1"
    assert check.PROFILES["sglang"]["expected"]["torch"] == "2.14.1"
    assert check.PROFILES["vllm"]["expected"]["torch"] == "2.13.0"
    assert "vllm" in check.PROFILES["sglang"]["forbidden"] and "sglang" in check.PROFILES["vllm"]["forbidden"]
    from packaging.specifiers import SpecifierSet

    torch_range = SpecifierSet(pins["TORCH_RANGE"].removeprefix("torch"))
    assert "2.13.0" in torch_range and "2.14.1" in torch_range  # the package installs beside both profiles


def test_check_resolution_names_each_problem():
    profile = check.PROFILES["sglang"]
    good = {
        "sglang": "0.5.23",
        "torch": "2.14.1",
        "transformers": "5.19.0",
        "rlinf": "0.3.0",
        "megatron-core": "0.16.1",
        "transformer-engine-cu13": "2.11.0",
        "sglang-kernel": "0.4.10",
        "torch-memory-saver": "0.0.10",
        "flashinfer-python": "0.7.2",
        "transformer-engine": "2.11.0",
    }
    pins = ["sglang==0.5.23", "transformer-engine[core-cu13]==2.11.0"]
    assert check.check_resolution(good, profile["expected"], profile["forbidden"], pins) == []
    bad = {**good, "torch": "2.13.0", "vllm": "0.32.0", "transformer-engine": "2.10.0"}
    del bad["torch-memory-saver"]
    problems = check.check_resolution(bad, profile["expected"], profile["forbidden"], pins)
    assert problems == [
        "torch: expected 2.14.1, resolved 2.13.0",
        "torch-memory-saver: expected a version, resolved None",
        "vllm 0.32.0 is in the resolution (it must not be)",
        "transformer-engine[core-cu13]==2.11.0: resolved 2.10.0",
    ]


def test_the_sglang_tests_copy_is_the_profiles_pin():
    """scripts/install.sh --dev installs SGLANG_SOURCE_REQUIREMENT for the SGLang tests (tests/support/sglang_source.py):
    the profile's own release, whose version config/rules/hardware.py names."""
    from rlinf_ext.protocol.engines import SGLANG_VERSION

    pins = check.setup_constants("SGLANG_SOURCE_REQUIREMENT", "SGLANG_REQUIREMENTS")
    assert check.source_pin_problems(pins) == []
    assert pins["SGLANG_SOURCE_REQUIREMENT"] == f"sglang=={SGLANG_VERSION}"
    stale = {**pins, "SGLANG_SOURCE_REQUIREMENT": "sglang==0.5.22"}
    assert check.source_pin_problems(stale) == [
        "SGLANG_SOURCE_REQUIREMENT=sglang==0.5.22 (the SGLang tests' copy) is not the sglang extra's pin "
        "['sglang==0.5.23']"
    ]
