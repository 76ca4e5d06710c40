"""The tiny-asset cache (assets/core/cache.py): its key follows the generating code and pins, entries are
published whole, and copies hold exactly the parts asked for. The generators are replaced by writers of one
small file per part (the real generation is covered by test_tiny_assets.py and test_trajectories_and_sft.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import rlinf_ext.assets.core.cache as cache
import rlinf_ext.assets.core.tiny as tiny
from rlinf_ext.assets.core.tiny import Parts, read_manifest


@pytest.fixture
def fake_generators(monkeypatch, tmp_path):
    """Generators that write one file per part and count their calls; the cache in tmp_path/cache."""
    calls: list[str] = []

    def writer(name, rel):
        def write(root_or_assets, seed, log, *a, **k):
            root = root_or_assets if isinstance(root_or_assets, Path) else root_or_assets.root
            calls.append(name)
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(f"{name} {seed}\n")
            return {}

        return write

    monkeypatch.setattr(tiny, "generate_base", writer("base", "corpus/wiki.jsonl"))
    monkeypatch.setattr(tiny, "build_sft_search_model", writer("sft_search", "models/qwen2-tiny-sft-search/w"))
    monkeypatch.setattr(tiny, "generate_registry", writer("registry", "registry/report.json"))
    monkeypatch.setattr(tiny, "manifest_entry", lambda root: {"heldout_fact_overlap": 0})
    monkeypatch.setattr(tiny, "generate_mm", writer("mm", "mm/emblems.json"))
    monkeypatch.setattr(tiny, "build_mm_sft_model", writer("mm_sft", "mm/models/qwen2.5-vl-tiny-sft/w"))
    monkeypatch.setattr(tiny, "mm_sft_manifest_entry", lambda root: {"heldout_emblem_overlap": 0})
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    return calls


def test_the_key_covers_the_generators_sources_and_the_pins():
    inputs = cache.key_inputs()
    for rel in (
        "rlinf_ext/assets/core/tiny.py",
        "rlinf_ext/assets/core/models.py",
        "rlinf_ext/assets/searchr1/sft.py",
        "rlinf_ext/assets/mmsearch/sft.py",
        "rlinf_ext/agent/searchr1/loop.py",  # imported by the SFT
        "rlinf_ext/assets/core/qwen2_5_chat_template.jinja",
    ):
        assert rel in inputs["files"], rel
    for dist in ("torch", "transformers", "tokenizers", "numpy", "safetensors"):
        assert dist in inputs["distributions"], dist
    assert "rlinf_ext/runner/launch.py" not in inputs["files"]  # not generating code: editing it keeps the cache


def test_the_key_changes_when_a_generating_source_changes(tmp_path, monkeypatch):
    pkg = tmp_path / "rlinf_ext"
    shutil.copytree(cache._package_dir(), pkg, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache, "_package_dir", lambda: pkg)
    before = cache.cache_key()
    assert before == cache.cache_key()  # stable
    models = pkg / "assets" / "core" / "models.py"
    models.write_text(models.read_text() + "\n# another shape\n")
    assert cache.cache_key() != before
    monkeypatch.setattr(cache, "_distribution_versions", lambda top: {"torch": "0.0"})
    models.write_text(models.read_text().removesuffix("\n# another shape\n"))
    assert cache.cache_key() != before  # same sources, other pins


def test_the_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache.cache_dir() == tmp_path / "x" / "rlinf_ext" / "tiny_assets"


def test_an_entry_is_built_once_and_grows_by_new_versions(fake_generators):
    calls = fake_generators
    a = cache.cached_tiny_assets(Parts(), log=lambda *a: None)
    assert calls == ["base"] and a.qwen2_tiny_sft_search is None
    assert read_manifest(a.root)["cache_key"] == cache.cache_key()
    assert cache.cached_tiny_assets(Parts(), log=lambda *a: None) == a and calls == ["base"]  # reused
    b = cache.cached_tiny_assets(Parts.of(sft_search=True), log=lambda *a: None)
    assert calls == ["base", "sft_search"] and b.root != a.root  # a new version beside the old one
    assert (a.root / "corpus" / "wiki.jsonl").is_file() and not (a.root / "models").exists()  # the old is untouched
    assert cache.entry_path().resolve() == b.root
    c = cache.cached_tiny_assets(Parts.of(registry=True), log=lambda *a: None)
    assert calls == ["base", "sft_search", "registry"] and c.registry is not None  # the warm start reused
    assert read_manifest(c.root)["registry"] == {"heldout_fact_overlap": 0}  # the split checks recorded
    assert not list(cache.cache_dir().glob(".tmp-*"))


def test_an_interrupted_build_publishes_nothing(fake_generators, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(tiny, "generate_mm", broken)
    with pytest.raises(RuntimeError, match="interrupted"):
        cache.cached_tiny_assets(Parts.of(mm=True), log=lambda *a: None)
    assert not cache.entry_path().exists() and not list(cache.cache_dir().glob(".tmp-*"))


def test_a_copy_holds_the_parts_asked_for_and_keeps_what_was_written_beside(fake_generators, tmp_path):
    calls = fake_generators
    cache.cached_tiny_assets(Parts.of(sft_search=True, registry=True, mm_sft=True), log=lambda *a: None)
    built = list(calls)
    root = tmp_path / "session"
    a = cache.copy_parts(root, Parts(), log=lambda *a: None)
    assert a.qwen2_tiny_sft_search is None and a.mm is None and not (root / "models").exists()
    assert calls == built  # copied, not generated
    (root / "index").mkdir()
    (root / "index" / "bm25").write_text("built by a test")
    b = cache.copy_parts(root, Parts.of(sft_search=True), log=lambda *a: None)
    assert b.qwen2_tiny_sft_search == root / "models" / "qwen2-tiny-sft-search" and b.registry is None
    assert (root / "index" / "bm25").read_text() == "built by a test"  # same code: only added to
    files = read_manifest(root)["files"]
    assert "models/qwen2-tiny-sft-search/w" in files and not any(k.startswith(("mm/", "registry/")) for k in files)
    assert "registry" not in read_manifest(root) and "mm_sft" not in read_manifest(root)  # checks go with files
    c = cache.copy_parts(root, Parts.of(mm_sft=True), log=lambda *a: None)
    assert read_manifest(c.root)["mm_sft"] == {"heldout_emblem_overlap": 0}
    assert cache.copy_parts(root, Parts.of(sft_search=True), log=lambda *a: None) == c  # keeps the parts it holds
    assert cache.copy_parts(root, Parts(), log=lambda *a: None) == c


def test_a_directory_of_other_code_is_replaced_whole(fake_generators, tmp_path):
    root = tmp_path / "outputs" / "tiny_assets"
    cache.copy_parts(root, Parts(), log=lambda *a: None)
    (root / "index").mkdir()
    (root / "index" / "bm25").write_text("an index of an older corpus")
    manifest = read_manifest(root)
    (root / "MANIFEST.json").write_text(json.dumps({**manifest, "cache_key": "older code"}))
    cache.copy_parts(root, Parts(), log=lambda *a: None)
    assert not (root / "index").exists() and read_manifest(root)["cache_key"] == cache.cache_key()
    assert not [p for p in root.parent.iterdir() if p.name != "tiny_assets"]  # no temporary left beside


@pytest.mark.parametrize(
    "model, vision, parts",
    [
        ("models/qwen2-tiny", False, Parts()),
        ("models/qwen2-tiny-sft-search", False, Parts.of(sft_search=True)),  # the base world's warm start
        ("registry/models/qwen2-tiny-reader", False, Parts.of(registry=True)),  # the tiny experiment's world
        ("mm/models/qwen2.5-vl-tiny", True, Parts.of(mm=True)),
        ("mm/models/qwen2.5-vl-tiny-sft", True, Parts.of(mm_sft=True)),
    ],
)
def test_the_launcher_copies_the_parts_its_model_needs(monkeypatch, tmp_path, model, vision, parts):
    from types import SimpleNamespace

    import rlinf_ext.runner.prepare as prepare

    asked = []
    monkeypatch.setattr(prepare, "copy_parts_in_child", lambda root, p: asked.append((root, p)))
    cfg = SimpleNamespace(
        paths=SimpleNamespace(tiny_assets=str(tmp_path)),
        agentloop=SimpleNamespace(agent="mmsearch" if vision else "searchr1"),
        rollout=SimpleNamespace(model=SimpleNamespace(model_path=f"{tmp_path}/{model}")),
    )
    assert prepare.prepare_tiny_assets(cfg) == tmp_path
    assert asked == [(tmp_path, parts)]


def test_the_launcher_starts_no_process_when_its_assets_are_in_place(monkeypatch, fake_generators, tmp_path):
    """A directory that already holds the parts, by this code: checked in the launcher's process (copying through
    a spawned process costs ~8 s of imports per launch); of other code, or missing a part: copied in the child."""
    from types import SimpleNamespace

    import rlinf_ext.runner.prepare as prepare

    root = tmp_path / "tiny_assets"
    cache.copy_parts(root, Parts.of(sft_search=True), log=lambda *a: None)
    asked = []
    monkeypatch.setattr(prepare, "copy_parts_in_child", lambda r, p: asked.append(p))

    def cfg(model):
        return SimpleNamespace(
            paths=SimpleNamespace(tiny_assets=str(root)),
            agentloop=SimpleNamespace(agent="searchr1"),
            rollout=SimpleNamespace(model=SimpleNamespace(model_path=f"{root}/{model}")),
        )

    assert prepare.prepare_tiny_assets(cfg("models/qwen2-tiny-sft-search")) == root
    assert prepare.prepare_tiny_assets(cfg("models/qwen2-tiny")) == root
    assert asked == []
    assert prepare.prepare_tiny_assets(cfg("registry/models/qwen2-tiny-reader")) == root  # the registry is not there
    assert asked == [Parts.of(registry=True)]
    manifest = read_manifest(root)
    (root / "MANIFEST.json").write_text(json.dumps({**manifest, "cache_key": "older code"}))
    prepare.prepare_tiny_assets(cfg("models/qwen2-tiny"))
    assert asked == [Parts.of(registry=True), Parts()]
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    (root / "models" / "qwen2-tiny-sft-search" / "w").unlink()  # a file of the part gone
    prepare.prepare_tiny_assets(cfg("models/qwen2-tiny-sft-search"))
    assert asked[-1] == Parts.of(sft_search=True)


def test_the_launcher_refuses_assets_inside_the_cache(monkeypatch, fake_generators, tmp_path):
    """An entry of the cache used as a run's asset directory would get the run's index beside it, and a launch of
    other code would replace it with only the parts that run needs (it happened: an entry lost its MM parts)."""
    from types import SimpleNamespace

    import rlinf_ext.runner.prepare as prepare
    from rlinf_ext.runner.errors import LaunchError

    entry = cache.cached_tiny_assets(Parts.of(sft_search=True), log=lambda *a: None).root
    monkeypatch.setattr(prepare, "copy_parts_in_child", lambda r, p: pytest.fail("copied into the cache"))
    cfg = SimpleNamespace(
        paths=SimpleNamespace(tiny_assets=str(entry)),
        agentloop=SimpleNamespace(agent="searchr1"),
        rollout=SimpleNamespace(model=SimpleNamespace(model_path=f"{entry}/models/qwen2-tiny")),
    )
    before = read_manifest(entry)
    with pytest.raises(LaunchError, match="inside the tiny-asset cache.*Fix: point paths.tiny_assets"):
        prepare.prepare_tiny_assets(cfg)
    assert read_manifest(entry) == before
    # a cache of links to that cache's entries (a private $RLINF_EXT_ASSET_CACHE): the real entry is still refused
    links = tmp_path / "links"
    links.mkdir()
    (links / cache.entry_path().name).symlink_to(entry)
    monkeypatch.setenv(cache.CACHE_ENV, str(links))
    with pytest.raises(LaunchError, match="inside the tiny-asset cache"):
        prepare.prepare_tiny_assets(cfg)
    assert read_manifest(entry) == before


def test_a_directory_made_with_out_is_used_as_it_is_or_refused_with_the_fix(monkeypatch, fake_generators, tmp_path):
    """`make-tiny-assets --out DIR` then a launch with paths.tiny_assets=DIR: the launcher copies nothing into DIR
    and builds nothing in the cache; a part missing, or other code's DIR, is refused naming it and the command."""
    from types import SimpleNamespace

    import rlinf_ext.runner.prepare as prepare
    from rlinf_ext.runner.errors import LaunchError

    root = tmp_path / "mine"
    tiny.make_tiny_assets(root, parts=Parts.of(sft_search=True), code_key=cache.cache_key())
    assert read_manifest(root)[tiny.OUT_DIR_MARK] and read_manifest(root)["cache_key"] == cache.cache_key()
    monkeypatch.setattr(prepare, "copy_parts_in_child", lambda r, p: pytest.fail("copied into the user's directory"))

    def cfg(model):
        return SimpleNamespace(
            paths=SimpleNamespace(tiny_assets=str(root)),
            agentloop=SimpleNamespace(agent="searchr1"),
            rollout=SimpleNamespace(model=SimpleNamespace(model_path=f"{root}/{model}")),
        )

    assert prepare.prepare_tiny_assets(cfg("models/qwen2-tiny-sft-search")) == root
    fix = r"Fix: `rlinf-ext make-tiny-assets --out \S+ --with-registry`"
    with pytest.raises(LaunchError, match=r"lacks registry .*" + fix):
        prepare.prepare_tiny_assets(cfg("registry/models/qwen2-tiny-reader"))
    (root / "models" / "qwen2-tiny-sft-search" / "w").unlink()
    with pytest.raises(LaunchError, match="lacks sft_search"):
        prepare.prepare_tiny_assets(cfg("models/qwen2-tiny-sft-search"))
    manifest = read_manifest(root)
    (root / "MANIFEST.json").write_text(json.dumps({**manifest, "cache_key": "older code"}))
    with pytest.raises(LaunchError, match="made by other code: its MANIFEST.json's cache_key is older code.*Fix: `"):
        prepare.prepare_tiny_assets(cfg("models/qwen2-tiny"))
    assert fake_generators == ["base", "sft_search"] and not (tmp_path / "cache").exists()  # nothing built elsewhere
    # the command again regenerates it with this code, and the launch goes through
    tiny.make_tiny_assets(root, code_key=cache.cache_key())
    assert fake_generators[2:] == ["base"] and prepare.prepare_tiny_assets(cfg("models/qwen2-tiny")) == root


CHILD_FILL = """
import sys
from types import SimpleNamespace
import rlinf_ext.runner.prepare as prepare
root = sys.argv[1]
cfg = SimpleNamespace(paths=SimpleNamespace(tiny_assets=root), agentloop=SimpleNamespace(agent="searchr1"),
                      rollout=SimpleNamespace(model=SimpleNamespace(model_path=root + "/models/qwen2-tiny")))
prepare.prepare_tiny_assets(cfg)
print("loaded:", sorted(m for m in ("bm25s", "numba", "llvmlite") if m in sys.modules))
"""


@pytest.mark.slow
def test_the_launcher_generates_missing_assets_outside_its_process(tmp_path):
    """Generating assets loads numba (bm25s), beside which vLLM cannot start an engine in the launcher's process,
    where the trained model is evaluated: with an empty cache the launcher must still end with none of them."""
    import os
    import subprocess
    import sys

    root = tmp_path / "tiny_assets"
    env = {**os.environ, cache.CACHE_ENV: str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD_FILL, str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(Path(__file__).resolve().parents[3]),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loaded: []" in out.stdout, out.stdout[-2000:]
    assert read_manifest(root)["cache_key"] == cache.cache_key()
