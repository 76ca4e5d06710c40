"""Hugging Face → Megatron torch-format checkpoint (the layout Megatron-LM / RLinf load) for any TP/PP.

HF tensors are read one at a time (safetensors are memory-mapped). A ``model_optim_rng.pt`` is one
pickle, so each pipeline stage is assembled for all its TP ranks, written, and freed before the next
stage: peak memory is about one stage (model / PP), not the whole model times TP.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from rlinf_ext.convert import hf_files
from rlinf_ext.convert.mapping import ConversionError, ConvertSpec, check_parallel, unit_stage, units
from rlinf_ext.convert.mg_checkpoint import RANK_FILE, iteration_dir_name, rank_dir_name, save_rank_file, write_tracker
from rlinf_ext.convert.state_dicts import check_hf_leftovers, tied_output_copy, unit_to_megatron


@dataclass(frozen=True)
class Hf2MgResult:
    out_dir: Path
    tp: int
    pp: int
    rank_files: list[str]
    seconds: float


def convert_hf_to_mg(
    hf_dir: str | Path,
    out_dir: str | Path,
    *,
    tp: int = 1,
    pp: int = 1,
    dtype: torch.dtype | None = None,
    te_layernorm_names: bool = True,
    padded_vocab_size: int | None = None,
    iteration: int | None = None,
    force: bool = False,
    progress: bool = True,
) -> Hf2MgResult:
    """Convert. ``iteration=None`` writes ``release`` (what Megatron-LM loads without a step count);
    ``dtype=None`` keeps the HF dtypes (bit-exact)."""
    start = time.perf_counter()
    if iteration is not None and iteration <= 0:
        raise ConversionError(
            f"--iteration must be > 0 (Megatron-LM rejects 0), got {iteration}; omit it for 'release'"
        )
    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise ConversionError(f"{hf_dir}: not a HF model folder (no config.json)")
    spec = ConvertSpec.from_hf_config(
        hf_dir, padded_vocab_size=padded_vocab_size, te_layernorm_names=te_layernorm_names
    )
    try:
        check_parallel(spec, tp, pp)
    except ConversionError as e:
        raise ConversionError(f"--tp {tp} --pp {pp} does not fit {hf_dir}: {e}") from None
    hf_files.check_output_dir(Path(out_dir).resolve(), force)
    reader = hf_files.HFReader(hf_dir)

    def get_hf(name: str) -> torch.Tensor:
        t = reader.get(name)
        return t.to(dtype) if dtype is not None else t

    consumed: set[str] = set()
    written: list[str] = []
    try:
        with hf_files.atomic_output_dir(out_dir, force) as tmp:
            iter_dir = tmp / iteration_dir_name(iteration)
            bar = tqdm(total=len(units(spec)), desc="hf2mg", unit="layer", disable=not progress)
            for stage in range(pp):
                per_tp: list[dict[str, Any]] = [{} for _ in range(tp)]
                for unit, layer in units(spec):
                    if unit_stage(spec, unit, layer, pp)[0] != stage:
                        continue
                    _, pieces, names = unit_to_megatron(spec, unit, layer, get_hf, tp, pp)
                    consumed.update(names)
                    for t in range(tp):
                        per_tp[t].update(pieces[t])
                    bar.update(1)
                if stage == pp - 1 and pp > 1 and spec.dims.tie_word_embeddings:
                    # Megatron's last stage keeps a copy of the tied embedding as output_layer.weight
                    embed = get_hf("model.embed_tokens.weight")
                    shards = unit_to_megatron(spec, "pre", None, lambda n: embed, tp, pp)[1]
                    copies = tied_output_copy(spec, tp, pp, [s["embedding.word_embeddings.weight"] for s in shards])
                    for t, extra in copies.items():
                        per_tp[t].update(extra)
                for t in range(tp):
                    path = iter_dir / rank_dir_name(t, stage, pp) / RANK_FILE
                    save_rank_file(path, per_tp[t], iteration)
                    written.append(str(path.relative_to(tmp)))
                del per_tp
            bar.close()
            check_hf_leftovers(spec, reader.names(), consumed, get_hf)
            write_tracker(tmp, iteration)
    finally:
        reader.close()
    return Hf2MgResult(Path(out_dir).resolve(), tp, pp, written, time.perf_counter() - start)
