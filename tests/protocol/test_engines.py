"""The engine registry (protocol/engines.py): one entry per engine, the only reader of ``rollout.rollout_backend``
besides the schema, and every fact it names is one the rest of the package knows."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf_ext.config import load_config
from rlinf_ext.config.schema import ExperimentConfig, RolloutConfig
from rlinf_ext.protocol import engines
from rlinf_ext.protocol.engines import ENGINE_KEY, ENGINES, EngineError, engine_spec, make_generator, read_key
from rlinf_ext.sync.sglang_transfer import DISTRIBUTED
from rlinf_ext.sync.vllm_transfer import TRANSFER_BACKENDS

REPO = Path(__file__).resolve().parents[2]
PARTS = ("rollout_worker", "generator", "vl_generator", "eval_preflight")


def test_the_engine_key_is_read_in_at_most_four_modules():
    readers = sorted(
        str(p.relative_to(REPO)) for p in (REPO / "rlinf_ext").rglob("*.py") if "rollout_backend" in p.read_text()
    )
    assert len(readers) <= 4, f"rollout_backend appears in {len(readers)} modules; ask engine_spec(cfg): {readers}"


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_part_of_every_entry_imports(name):
    """Importing a part starts nothing: sglang (absent here) and vLLM are imported only where an engine starts."""
    spec = ENGINES[name]
    assert spec.name == name and spec.devices and set(spec.devices) <= {"cpu", "gpu"}
    for part in PARTS:
        if getattr(spec, part):
            assert callable(spec.load(part)), (name, part)
    assert spec.generator, f"{name} evaluates no text agent"


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_fact_names_what_the_package_knows(name):
    spec = ENGINES[name]
    cfg = ExperimentConfig()
    read_key(cfg, spec.dtype_key), read_key(cfg, spec.concurrency_key)  # keys of the schema
    routes = {spec.collocated_route, spec.disaggregated_route}
    if "gpu" in spec.devices:  # each GPU route is carried by a sync module, or by RLinf's paired buckets
        assert routes <= {*TRANSFER_BACKENDS, DISTRIBUTED, "paired"}, routes
        assert spec.packages and spec.install.startswith("bash scripts/install.sh") and spec.memory_model
    assert spec.memory_model in ("", "vllm", "sglang")  # models/memory.py:engine_memory's backends
    assert spec.logprobs and (not spec.pinned or spec.packages)


def test_the_default_engine_is_set_in_the_schema_only():
    """Two layers say which engine runs: the schema's default and the experiment's YAML (no cluster profile)."""
    assert RolloutConfig().rollout_backend == "vllm"
    for path in (REPO / "configs").rglob("*.yaml"):
        assert "rollout_backend" not in path.read_text(), path


def test_an_unregistered_name_is_refused_with_the_choices():
    with pytest.raises(EngineError) as info:
        engine_spec("trtllm")
    assert f"{ENGINE_KEY}='trtllm' is not a registered engine" in str(info.value)
    assert all(name in info.value.fix for name in ENGINES)
    cfg = load_config("tiny-cpu", ["rollout.rollout_backend=hf"], strict=False)
    assert engine_spec(cfg) is ENGINES["hf"]


def test_an_evaluation_the_engine_does_not_build_names_the_key_and_the_fix():
    cfg = load_config("tiny-mm-cpu-eval", ["rollout.rollout_backend=sglang"], strict=False)
    with pytest.raises(EngineError) as info:
        make_generator(cfg, vision=True)
    assert "SGLang does not evaluate a vision-language agent" in info.value.problem
    assert info.value.fix == f"set {ENGINE_KEY}=vllm."


def test_a_pinned_engine_at_another_release_counts_as_missing(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: object())  # everything importable
    sglang = ENGINES["sglang"]
    monkeypatch.setattr(engines, "installed_version", lambda package: "0.5.9")
    assert engines.missing_packages(sglang, saver=True) == ["sglang==0.5.23"]
    monkeypatch.setattr(engines, "installed_version", lambda package: engines.SGLANG_VERSION)
    assert engines.missing_packages(sglang, saver=True) == []
    assert engines.missing_packages(ENGINES["hf"], saver=True) == []
