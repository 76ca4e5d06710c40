"""The vLLM VL engine's pure parts, without vLLM: request building (pad runs collapsed, images in order, their
sha1s), the banned-ids whitelist, expansion mismatches, engine options, the checkpoint names of the actor's
weights, and the refusal of a processor directory vLLM cannot load without torchvision."""

from __future__ import annotations

import io
import json

import pytest

from rlinf_ext.generation.vllm_vl import (
    allowed_token_ids,
    check_processor_dir,
    checkpoint_name,
    collapse_image_runs,
    engine_mismatch,
    mm_request,
    vl_engine_options,
)
from rlinf_ext.generation.vllm_wire import VLLMEngineOptions
from rlinf_ext.protocol.images import ImageRef

S, P, E = 90, 91, 92  # vision_start, image_pad, vision_end


def png(colour) -> ImageRef:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (56, 56), colour).save(buf, format="PNG")
    return ImageRef.from_bytes(buf.getvalue())


def test_collapse_keeps_one_pad_per_image_run():
    ids = [1, S, P, P, P, P, E, 2, 3, S, P, P, E, 4]
    assert collapse_image_runs(ids, (S, P, E)) == [1, S, P, E, 2, 3, S, P, E, 4]
    assert collapse_image_runs([1, 2], (S, P, E)) == [1, 2]


def test_request_carries_every_image_in_order_with_its_sha1():
    red, blue = png("red"), png("blue")
    request = mm_request([1, S, P, P, E, 2, S, P, E], [red, blue], (S, P, E))
    assert request["prompt_token_ids"] == [1, S, P, E, 2, S, P, E]
    assert [im.getpixel((0, 0)) for im in request["multi_modal_data"]["image"]] == [(255, 0, 0), (0, 0, 255)]
    assert request["multi_modal_uuids"] == {"image": [red.sha1, blue.sha1]}
    assert mm_request([1, 2], [], (S, P, E)) == {"prompt_token_ids": [1, 2]}


def test_request_refuses_a_wrong_image_count_or_type():
    with pytest.raises(ValueError, match="1 image run.*2 image"):
        mm_request([S, P, E], [png("red"), png("blue")], (S, P, E))
    with pytest.raises(TypeError, match="ImageRef"):
        mm_request([S, P, E], [b"raw"], (S, P, E))
    with pytest.raises(ValueError, match="malformed"):
        mm_request([S, 5, E], [png("red")], (S, P, E))


def test_allowed_ids_are_the_complement_of_the_banned():
    assert allowed_token_ids(6, [1, 4, 9]) == [0, 2, 3, 5]
    assert allowed_token_ids(6, []) is None


def test_mismatch_is_any_difference_from_the_engine_prompt():
    assert not engine_mismatch([1, S, P, P, E], [1, S, P, P, E])
    assert engine_mismatch([1, S, P, E], [1, S, P, P, E])
    assert not engine_mismatch([1], None)


def test_engine_options_cpu_and_gpu():
    cpu = vl_engine_options(VLLMEngineOptions(model_path="m"), cuda=False, max_images=5)
    assert cpu.extra == {
        "limit_mm_per_prompt": {"image": 5},
        "logprobs_mode": "processed_logprobs",
        "model_impl": "transformers",
        "trust_remote_code": True,
    }
    gpu = vl_engine_options(VLLMEngineOptions(model_path="m", extra={"model_impl": "vllm"}), cuda=True)
    assert gpu.extra["model_impl"] == "vllm" and "trust_remote_code" not in gpu.extra


def test_checkpoint_names_invert_transformers_conversion_mapping():
    """Renaming back with transformers' own Qwen2.5-VL mapping (what ``from_pretrained`` applies) gives the module
    names again, and the loader's layout is the checkpoint's (``visual.*``, ``model.layers.*``)."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    renamings = [
        t
        for t in get_checkpoint_conversion_mapping("Qwen2_5_VLForConditionalGeneration")
        if isinstance(t, WeightRenaming)
    ]
    names = [
        "model.language_model.layers.0.mlp.down_proj.weight",
        "model.language_model.embed_tokens.weight",
        "model.language_model.norm.weight",
        "model.visual.blocks.1.attn.qkv.bias",
        "model.visual.merger.mlp.0.weight",
        "lm_head.weight",
    ]
    saved = [checkpoint_name(n) for n in names]
    assert saved[0] == "model.layers.0.mlp.down_proj.weight" and saved[3] == "visual.blocks.1.attn.qkv.bias"
    assert [rename_source_key(n, renamings, [])[0] for n in saved] == names


def test_processor_dir_without_auto_map_is_refused_with_the_fix(tmp_path):
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor"}))
    with pytest.raises(ValueError, match="auto_map.*make-tiny-assets"):
        check_processor_dir(tmp_path)
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"auto_map": {"AutoProcessor": "vl_processor.ImageOnlyQwen2_5_VLProcessor"}})
    )
    check_processor_dir(tmp_path)


def test_saved_processor_carries_its_class_for_auto_processor(tmp_path):
    """The image-only processor saves an auto_map and its own module, so AutoProcessor (vLLM's loader) builds it
    with trust_remote_code where the stock class needs torchvision."""
    from transformers import AutoProcessor

    from rlinf_ext.assets.mmsearch.models import make_processor, train_vl_tokenizer

    processor = make_processor(train_vl_tokenizer(["which city <search> red </search>"] * 20, vocab_size=300))
    processor.save_pretrained(str(tmp_path))
    check_processor_dir(tmp_path)
    assert (tmp_path / "vl_processor.py").is_file()
    loaded = AutoProcessor.from_pretrained(str(tmp_path), trust_remote_code=True)
    assert type(loaded).__name__ == "ImageOnlyQwen2_5_VLProcessor" and not hasattr(loaded, "video_processor")
    image = png("green")
    text = loaded.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}], add_generation_prompt=True
    )
    ours = processor(text=[text], images=[image.to_pil()], return_tensors="pt")
    theirs = loaded(text=[text], images=[image.to_pil()], return_tensors="pt")
    assert ours.input_ids.tolist() == theirs.input_ids.tolist()
    assert (ours.pixel_values == theirs.pixel_values).all()
