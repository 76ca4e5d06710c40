"""`rlinf-ext make-tiny-assets` from the command line."""

from __future__ import annotations

import shutil

from rlinf_ext.cli import main


def test_make_tiny_assets_cli_prints_a_summary(tiny_assets, tmp_path, capsys):
    out = tmp_path / "assets"
    shutil.copytree(tiny_assets.root, out)  # a complete directory: the verb reuses it
    assert main(["make-tiny-assets", "--out", str(out), "--seed", "0"]) == 0
    text = capsys.readouterr().out
    assert f"reusing {out}" in text
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
