"""`rlinf-ext make-tiny-assets` from the command line."""

from __future__ import annotations

import json
import shutil

from rlinf_ext.assets.core.cache import cache_key
from rlinf_ext.assets.core.commands import launch_lines
from rlinf_ext.assets.core.tiny import OUT_DIR_MARK, read_manifest
from rlinf_ext.cli import main


def test_make_tiny_assets_cli_prints_a_summary(tiny_assets, tmp_path, capsys):
    out = tmp_path / "assets"
    shutil.copytree(tiny_assets.root, out)  # a complete directory of this code: the verb reuses it
    manifest = read_manifest(out)
    (out / "MANIFEST.json").write_text(json.dumps({**manifest, "cache_key": cache_key()}))
    assert main(["make-tiny-assets", "--out", str(out), "--seed", "0"]) == 0
    text = capsys.readouterr().out
    assert f"reusing {out}" in text
    assert read_manifest(out)[OUT_DIR_MARK] is True  # the launcher uses it as it is
    # the launch lines, each with the part it still needs (the session's directory may hold the registry)
    assert text.rstrip().endswith("\n".join(launch_lines(out, 0))) and f"train tiny-cpu paths.tiny_assets={out}" in text
    assert "wiki.jsonl" in text and " passages)" in text
    for bench in tiny_assets.benchmarks:
        assert f"test {bench}" in text
    assert "qwen2-tiny-untied" in text and "bert-tiny-encoder" in text


def test_make_tiny_assets_cli_generates_a_new_seed(tmp_path, capsys):
    out = tmp_path / "seed5"
    assert main(["make-tiny-assets", "--out", str(out), "--seed", "5"]) == 0
    text = capsys.readouterr().out
    assert "corpus:" in text and "tokenizer:" in text and "models:" in text
    assert (out / "MANIFEST.json").is_file() and (out / "models" / "qwen2-tiny" / "model.safetensors").is_file()


def test_eval_sft_needs_with_sft_search(tmp_path, capsys):
    assert main(["make-tiny-assets", "--out", str(tmp_path / "x"), "--eval-sft"]) == 2
    assert "--eval-sft needs --with-sft-search" in capsys.readouterr().out


def test_the_launch_line_names_the_experiments_a_directory_serves(tmp_path):
    (tmp_path / "MANIFEST.json").write_text(json.dumps({"seed": 0, "with_registry": True}))
    lines = launch_lines(tmp_path, 0)
    assert f"  rlinf-ext train tiny-cpu paths.tiny_assets={tmp_path}" in lines
    assert (
        f"  rlinf-ext train tiny-mm-cpu paths.tiny_assets={tmp_path}   (first: rlinf-ext make-tiny-assets --out "
        f"{tmp_path} --with-registry --with-mm --with-mm-sft)" in lines
    )
    assert "seed 0" in launch_lines(tmp_path, 5)[0]
