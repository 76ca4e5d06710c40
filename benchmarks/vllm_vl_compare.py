"""Greedy first turns of the tiny MMSearch-R1 eval on the HF VL engine and on vLLM (fp32, CPU): how many are
identical, expansion mismatches, and each engine's wall time for all of them.

    python benchmarks/vllm_vl_compare.py --assets outputs/tiny_assets [--model DIR]

The model defaults to the assets' warm-started tiny Qwen2.5-VL (`make-tiny-assets --with-mm --with-mm-sft`);
its directory must carry the image-only processor for AutoProcessor (tiny MM assets v4 do).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from rlinf_ext.data.fvqa import read_fvqa
from rlinf_ext.generation.hf_vl import HFVLGenerator
from rlinf_ext.generation.vllm_vl import VLLMVLGenerator
from rlinf_ext.generation.vllm_wire import VLLMEngineOptions
from rlinf_ext.protocol.generation import SamplingParams

PX = 56 * 56
STOPS = ["</search>", "</text_search>", "</answer>"]


def first_turn_ids(processor, question: str, images) -> list[int]:
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": question}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return processor(text=[text], images=[r.to_pil() for r in images], return_tensors="pt").input_ids[0].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    model = args.model or args.assets / "mm" / "models" / "qwen2.5-vl-tiny-sft"
    rows = read_fvqa(args.assets / "mm" / "data" / "test.parquet", PX, PX)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, do_sample=False, stop=STOPS)

    hf = HFVLGenerator.from_pretrained(model, num_threads=None)  # before vLLM: its backend decorates the HF classes
    cases = [(first_turn_ids(hf.processor, r.question, r.images), r.images) for r in rows]

    async def run(gen):
        return await asyncio.gather(*(gen.generate(ids, params, images=imgs) for ids, imgs in cases))

    t0 = time.perf_counter()
    ref = asyncio.run(run(hf))
    hf_s = time.perf_counter() - t0
    vllm = VLLMVLGenerator.start(
        VLLMEngineOptions(
            model_path=str(model), dtype="float32", max_model_len=1536, kv_cache_memory_bytes=64 << 20, max_num_seqs=64
        ),
        cuda=False,
    )
    t0 = time.perf_counter()
    ours = asyncio.run(run(vllm))
    vllm_s = time.perf_counter() - t0
    same = sum(a.output_ids == b.output_ids for a, b in zip(ref, ours))
    print(f"questions: {len(cases)}")
    print(f"identical greedy first turns: {same}/{len(cases)}")
    print(f"expansion mismatches: {vllm.prompt_mismatches}/{vllm.prompts_checked}")
    print(
        f"seconds for all first turns: HF {hf_s:.1f}  vLLM {vllm_s:.1f}  (HF / vLLM {hf_s / vllm_s:.1f}x); "
        f"vLLM engine start {vllm.start_s:.1f}"
    )
    for a, b in zip(ref, ours):
        if a.output_ids != b.output_ids:
            print(f"differs: HF {a.text!r} | vLLM {b.text!r}")
    vllm.shutdown()


if __name__ == "__main__":
    main()
