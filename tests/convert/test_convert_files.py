"""File-level conversion: bit-exact round trips through the on-disk layouts, checkpoint discovery,
template copying, atomic output, and one test per strictness failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlinf_ext.convert.hf2mg import convert_hf_to_mg
from rlinf_ext.convert.mapping import ConversionError
from rlinf_ext.convert.mg2hf import convert_mg_to_hf
from rlinf_ext.convert.mg_checkpoint import RANK_FILE, load_rank_file, resolve_iteration_dir


def _hf2mg(src, out, tp, pp, **kw):
    return convert_hf_to_mg(src, out, tp=tp, pp=pp, progress=False, **kw)


def _mg2hf(mg, out, template, **kw):
    return convert_mg_to_hf(mg, out, template, progress=False, **kw)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("tie", ["tied", "untied"])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_round_trip_through_files_is_bit_exact(qwen2_models, read_weights, tmp_path, tp, pp, tie, dtype):
    src = qwen2_models[(tie, dtype)]
    res = _hf2mg(src, tmp_path / "mg", tp, pp)
    assert (tmp_path / "mg" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert len(res.rank_files) == tp * pp
    _mg2hf(tmp_path / "mg", tmp_path / "hf", src)
    original = read_weights(src)
    converted = read_weights(tmp_path / "hf")
    assert set(converted) == set(original)
    for k, v in original.items():
        assert converted[k].dtype == v.dtype and torch.equal(converted[k], v), k


def test_output_is_a_loadable_sharded_hf_model_with_template_files(qwen2_models, read_weights, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = qwen2_models[("untied", "fp32")]
    (src / "stale-copy.bin").write_bytes(b"not a weight to copy")  # template weights are never copied
    try:
        _hf2mg(src, tmp_path / "mg", 2, 1)
        res = _mg2hf(tmp_path / "mg", tmp_path / "hf", src, dtype=torch.bfloat16, max_shard_bytes=60_000)
    finally:
        (src / "stale-copy.bin").unlink()
    out = tmp_path / "hf"
    assert len(res.shard_files) > 1, "small max shard size must produce several shards"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == res.shard_files
    assert {p.name for p in out.glob("*.safetensors")} == set(res.shard_files)
    assert not (out / "stale-copy.bin").exists() and not (out / "model.safetensors").exists()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file(), name
    # transformers 5 writes (and prefers) `dtype`: the fp32 template has it, so the bf16 output must rewrite it,
    # or the converted model silently loads in fp32
    assert json.loads((src / "config.json").read_text())["dtype"] == "float32"
    written = json.loads((out / "config.json").read_text())
    assert written["dtype"] == written["torch_dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype="auto")
    assert model.dtype == torch.bfloat16
    ref = read_weights(src)
    assert torch.equal(model.state_dict()["lm_head.weight"], ref["lm_head.weight"].to(torch.bfloat16))
    AutoTokenizer.from_pretrained(str(out))
    assert not list(tmp_path.glob(".hf.tmp-*")), "temporary folder left behind"


def test_accepts_actor_dir_iteration_dir_and_single_iter_folder(qwen2_models, read_weights, tmp_path):
    src = qwen2_models[("tied", "fp32")]
    actor = tmp_path / "global_step_5" / "actor"
    _hf2mg(src, actor, 2, 1, iteration=5)
    assert (actor / "latest_checkpointed_iteration.txt").read_text() == "5"
    iter_dir = actor / "iter_0000005"
    assert resolve_iteration_dir(actor) == iter_dir
    assert resolve_iteration_dir(iter_dir) == iter_dir
    (actor / "latest_checkpointed_iteration.txt").unlink()
    assert resolve_iteration_dir(actor) == iter_dir  # one iter_* folder, no tracker
    ckpt = torch.load(iter_dir / "mp_rank_00" / RANK_FILE, weights_only=False)
    assert ckpt["checkpoint_version"] == 3.0 and ckpt["iteration"] == 5
    assert "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight" in ckpt["model"]
    for i, mg in enumerate([actor, iter_dir]):
        _mg2hf(mg, tmp_path / f"hf{i}", src)
        assert torch.equal(
            read_weights(tmp_path / f"hf{i}")["model.norm.weight"], read_weights(src)["model.norm.weight"]
        )
    shutil.copytree(iter_dir, actor / "iter_0000009")
    with pytest.raises(ConversionError, match="several iterations \\(iter_0000005, iter_0000009\\)"):
        resolve_iteration_dir(actor)


def test_local_layernorm_names_and_training_style_checkpoints_convert(qwen2_models, read_weights, tmp_path):
    """Checkpoints written by a local-spec model with optimizer/args entries (as training saves)."""
    import argparse

    src = qwen2_models[("untied", "fp32")]
    _hf2mg(src, tmp_path / "mg", 1, 1, te_layernorm_names=False)
    f = tmp_path / "mg" / "release" / "mp_rank_00" / RANK_FILE
    ckpt = torch.load(f, weights_only=False)
    assert "decoder.layers.0.input_layernorm.weight" in ckpt["model"]
    ckpt.update(
        args=argparse.Namespace(tensor_model_parallel_size=1),
        optimizer={"step": torch.tensor(3)},
        rng_state=[{"random_rng_state": (3, (1, 2), None)}],
    )
    torch.save(ckpt, f)
    _mg2hf(tmp_path / "mg", tmp_path / "hf", src)
    assert torch.equal(
        read_weights(tmp_path / "hf")["model.layers.0.input_layernorm.weight"],
        read_weights(src)["model.layers.0.input_layernorm.weight"],
    )


# --------------------------------------------------------------------------- failures, one test each


@pytest.fixture()
def tp2_checkpoint(qwen2_models, tmp_path):
    src = qwen2_models[("tied", "fp32")]
    _hf2mg(src, tmp_path / "mg", 2, 2)
    return src, tmp_path / "mg", tmp_path / "mg" / "release"


def _edit_rank(path: Path, fn) -> None:
    ckpt = torch.load(path, weights_only=False)
    fn(ckpt["model"])
    torch.save(ckpt, path)


def test_missing_rank_is_named(tp2_checkpoint, tmp_path):
    src, mg, it = tp2_checkpoint
    shutil.rmtree(it / "mp_rank_01_001")
    with pytest.raises(ConversionError, match="missing rank files: .*mp_rank_01_001/model_optim_rng.pt"):
        _mg2hf(mg, tmp_path / "hf", src)
    assert not (tmp_path / "hf").exists()


def test_shape_mismatch_is_named(tp2_checkpoint, tmp_path):
    src, mg, it = tp2_checkpoint
    _edit_rank(
        it / "mp_rank_01_000" / RANK_FILE,
        lambda m: m.__setitem__("decoder.layers.0.mlp.linear_fc2.weight", torch.zeros(64, 10)),
    )
    with pytest.raises(
        ConversionError,
        match="mp_rank_01_000/model_optim_rng.pt: decoder.layers.0.mlp.linear_fc2.weight has shape \\(64, 10\\), expected \\(64, 88\\)",
    ):
        _mg2hf(mg, tmp_path / "hf", src)


def test_replicated_tensor_differing_across_tp_is_named(tp2_checkpoint, tmp_path):
    src, mg, it = tp2_checkpoint
    name = "decoder.final_layernorm.weight"
    _edit_rank(it / "mp_rank_01_001" / RANK_FILE, lambda m: m[name].add_(1.0))
    with pytest.raises(ConversionError, match=f"replicated tensor {name} differs between TP rank 0 and TP rank 1"):
        _mg2hf(mg, tmp_path / "hf", src)


def test_unconsumed_tensor_is_named(tp2_checkpoint, tmp_path):
    src, mg, it = tp2_checkpoint
    _edit_rank(
        it / "mp_rank_00_001" / RANK_FILE,
        lambda m: m.__setitem__("decoder.layers.0.self_attention.q_layernorm.weight", torch.ones(16)),
    )
    with pytest.raises(
        ConversionError, match="mp_rank_00_001/model_optim_rng.pt: Megatron tensors not consumed.*q_layernorm"
    ):
        _mg2hf(mg, tmp_path / "hf", src)
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf.tmp-*"))


def test_missing_tensor_is_named(tp2_checkpoint, tmp_path):
    src, mg, it = tp2_checkpoint
    _edit_rank(it / "mp_rank_00_000" / RANK_FILE, lambda m: m.pop("decoder.layers.0.self_attention.linear_qkv.bias"))
    with pytest.raises(
        ConversionError,
        match="mp_rank_00_000/model_optim_rng.pt: tensor decoder.layers.0.self_attention.linear_qkv.bias is missing",
    ):
        _mg2hf(mg, tmp_path / "hf", src)


def test_tp_pp_inconsistent_with_the_model(qwen2_models, tmp_path):
    src = qwen2_models[("tied", "fp32")]
    with pytest.raises(
        ConversionError, match="--tp 4 --pp 1 does not fit.*num_key_value_heads=2 is not divisible by TP=4"
    ):
        _hf2mg(src, tmp_path / "mg4", 4, 1)
    with pytest.raises(ConversionError, match="num_hidden_layers=2 is not divisible by PP=3"):
        _hf2mg(src, tmp_path / "mg3", 1, 3)
    assert not (tmp_path / "mg4").exists() and not (tmp_path / "mg3").exists()
    # a TP=4 grid on disk (4 KV-group-incompatible ranks) is refused before reading any tensor
    _hf2mg(src, tmp_path / "mg", 1, 1)
    it = tmp_path / "mg" / "release"
    for r in (1, 2, 3):
        shutil.copytree(it / "mp_rank_00", it / f"mp_rank_{r:02d}")
    with pytest.raises(ConversionError, match="checkpoint has TP=4, PP=1; TP/PP inconsistent with the model"):
        _mg2hf(tmp_path / "mg", tmp_path / "hf", src)


def test_wrong_template_is_a_shape_error(qwen2_models, tmp_path):
    src = qwen2_models[("tied", "fp32")]
    _hf2mg(src, tmp_path / "mg", 1, 1)
    template = tmp_path / "template"
    shutil.copytree(src, template)
    cfg = json.loads((template / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (template / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="linear_fc1.weight has shape \\(352, 64\\), expected \\(256, 64\\)"):
        _mg2hf(tmp_path / "mg", tmp_path / "hf", template)


def test_existing_output_and_interrupted_conversion_leave_no_complete_looking_folder(tp2_checkpoint, tmp_path):
    src, mg, it = tp2_checkpoint
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(ConversionError, match="already exists and is not empty.*--force"):
        _mg2hf(mg, out, src)
    assert (out / "keep.txt").read_text() == "user data"
    # the last stage is unreadable: the error comes after earlier shards were streamed out
    (it / "mp_rank_01_001" / RANK_FILE).write_bytes(b"truncated")
    with pytest.raises(ConversionError, match="mp_rank_01_001/model_optim_rng.pt: cannot be read"):
        _mg2hf(mg, tmp_path / "hf2", src)
    assert not (tmp_path / "hf2").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".hf")]


def test_rank_file_without_model_entry(tmp_path):
    f = tmp_path / "model_optim_rng.pt"
    torch.save({"model0": {}, "model1": {}}, f)
    with pytest.raises(ConversionError, match="virtual-pipeline checkpoints"):
        load_rank_file(f)


def test_legacy_torch_save_format_is_read_without_mmap(qwen2_models, read_weights, tmp_path):
    """Old non-zip rank files cannot be memory-mapped; they are read into RAM (and never page-released)."""
    src = qwen2_models[("tied", "fp32")]
    _hf2mg(src, tmp_path / "mg", 1, 2)
    for f in (tmp_path / "mg" / "release").glob("mp_rank_*/" + RANK_FILE):
        torch.save(torch.load(f, weights_only=False), f, _use_new_zipfile_serialization=False)
    _mg2hf(tmp_path / "mg", tmp_path / "hf", src)
    out, ref = read_weights(tmp_path / "hf"), read_weights(src)
    assert set(out) == set(ref) and all(torch.equal(out[k], ref[k]) for k in ref)
