"""Megatron (any TP/PP) → Hugging Face sharded safetensors, one layer at a time.

Rank files are memory-mapped; each unit (embedding, one decoder layer, final norm/head) is merged
over TP, cast, and handed to a writer thread that streams it into a pre-planned safetensors shard,
while the pages of the source tensors already used are dropped. Peak memory stays near one layer.
"""

from __future__ import annotations

import ctypes
import sys
import time
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from rlinf_ext.convert import hf_files
from rlinf_ext.convert.mapping import (
    ConversionError,
    ConvertSpec,
    check_parallel,
    hf_names,
    mg_name,
    unit_stage,
    units,
)
from rlinf_ext.convert.mg_checkpoint import (
    RankLayout,
    discover_ranks,
    load_rank_file,
    prefetch_pages,
    release_pages,
    resolve_iteration_dir,
)
from rlinf_ext.convert.state_dicts import check_mg_leftovers, check_tied_copy, unit_to_hf_pieces
from rlinf_ext.convert.tensor_math import expected_hf_shapes

DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # what transformers' save_pretrained uses


@dataclass(frozen=True)
class Mg2HfResult:
    out_dir: Path
    iter_dir: Path
    tp: int
    pp: int
    num_tensors: int
    shard_files: list[str]
    copied_files: list[str]
    seconds: float


def open_megatron_checkpoint(mg_dir: str | Path) -> tuple[RankLayout, dict[tuple[int, int], dict[str, Any]]]:
    """Locate and memory-map every rank of a Megatron checkpoint: ``(layout, {(tp, pp): state})``."""
    layout = discover_ranks(resolve_iteration_dir(mg_dir))
    states = {(t, p): load_rank_file(layout.rank_file(t, p)) for p in range(layout.pp) for t in range(layout.tp)}
    return layout, states


def spec_for_checkpoint(
    hf_config: Any, layout: RankLayout, states, padded_vocab_size: int | None = None
) -> ConvertSpec:
    """The spec for a checkpoint; padded vocab rows are read from the embedding shard when not given."""
    spec = ConvertSpec.from_hf_config(hf_config, padded_vocab_size=padded_vocab_size)
    try:
        check_parallel(spec, layout.tp, layout.pp)
    except ConversionError as e:
        raise ConversionError(f"{layout.iter_dir}: checkpoint has TP={layout.tp}, PP={layout.pp}; {e}") from None
    if padded_vocab_size is None:
        emb = states[(0, 0)].get("embedding.word_embeddings.weight")
        if emb is None:
            raise ConversionError(f"{layout.rank_file(0, 0)}: no embedding.word_embeddings.weight on the first stage")
        rows = emb.shape[0] * layout.tp
        if rows < spec.dims.vocab_size:
            raise ConversionError(
                f"{layout.rank_file(0, 0)}: embedding has {rows} rows over TP={layout.tp}, fewer than "
                f"vocab_size={spec.dims.vocab_size} in the HF config (wrong --hf-template?)"
            )
        spec = ConvertSpec.from_hf_config(hf_config, padded_vocab_size=rows)
    return spec


def _source_dtype(spec, unit, layer, states, pp) -> list[torch.dtype]:
    pp_rank, local = unit_stage(spec, unit, layer, pp)
    dtypes = []
    for rule in spec.rules(unit):
        state = states[(0, pp_rank)]
        names = [mg_name(rule, local, True), mg_name(rule, local, False)]
        found = next((state[n] for n in names if n in state), None)
        dt = found.dtype if found is not None else torch.float32  # missing: reported by unit_to_hf
        dtypes += [dt] * len(rule.hf)
    return dtypes


def plan_hf_tensors(spec: ConvertSpec, states, pp: int, dtype: torch.dtype | None) -> list[hf_files.PlannedTensor]:
    planned = []
    for unit, layer in units(spec):
        src_dtypes = iter(_source_dtype(spec, unit, layer, states, pp))
        for rule in spec.rules(unit):
            for name, shape in zip(hf_names(rule, layer), expected_hf_shapes(spec, rule)):
                planned.append(hf_files.PlannedTensor(name, dtype or next(src_dtypes), shape))
    return planned


def _tune_malloc() -> None:
    """Keep freed buffers (row-parallel merges, up to 32 MiB) in the heap for reuse: each fresh
    allocation would otherwise be page-faulted in again, which costs more than the copy itself."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD (glibc's maximum)
        libc.mallopt(-1, 1024 * 1024 * 1024)  # M_TRIM_THRESHOLD
    except Exception:
        pass


class _closing:
    """Close every still-open shard file when the conversion stops early."""

    def __init__(self, writers: dict):
        self.writers = writers

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None:
            for w in self.writers.values():
                w.abort()
        return False


def convert_mg_to_hf(
    mg_dir: str | Path,
    out_dir: str | Path,
    hf_template: str | Path,
    *,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    padded_vocab_size: int | None = None,
    force: bool = False,
    progress: bool = True,
) -> Mg2HfResult:
    """Convert; ``dtype=None`` keeps each tensor's dtype (bit-exact). See the module docstring."""
    start = time.perf_counter()
    template = Path(hf_template)
    if not (template / "config.json").is_file():
        raise ConversionError(f"{template}: --hf-template must be a HF model folder with config.json")
    hf_files.check_output_dir(Path(out_dir).resolve(), force)
    layout, states = open_megatron_checkpoint(mg_dir)
    tp, pp = layout.tp, layout.pp
    spec = spec_for_checkpoint(template, layout, states, padded_vocab_size)
    planned = plan_hf_tensors(spec, states, pp, dtype)
    shards = hf_files.plan_shards(planned, max_shard_bytes)
    shard_names = hf_files.shard_file_names(len(shards))
    shard_of = {t.name: i for i, shard in enumerate(shards) for t in shard}

    def where(t: int, p: int) -> str:
        return str(layout.rank_file(t, p))

    touched: list[torch.Tensor] = []
    # page release is only safe on memory-mapped files (legacy-format files are read into RAM)
    mmapped = {k for k in states if zipfile.is_zipfile(layout.rank_file(*k))}

    def get_mg(t: int, p: int, name: str) -> torch.Tensor:
        tensor = states[(t, p)][name]  # KeyError: unit_to_hf_pieces tries the other layer-norm name
        if not torch.is_tensor(tensor):
            raise ConversionError(f"{where(t, p)}: {name} is a {type(tensor).__name__}, not a tensor")
        prefetch_pages(tensor)
        if (t, p) in mmapped:
            touched.append(tensor)
        return tensor

    consumed: dict[tuple[int, int], set[str]] = {k: set() for k in states}
    _tune_malloc()
    with hf_files.atomic_output_dir(out_dir, force) as tmp:
        writers: dict[int, hf_files.SafetensorsStreamWriter] = {}

        def write_unit(tensors: dict[str, list[torch.Tensor]], sources: list[torch.Tensor]) -> None:
            for name, pieces in tensors.items():
                i = shard_of[name]
                if i not in writers:
                    writers[i] = hf_files.SafetensorsStreamWriter(tmp / shard_names[i], shards[i])
                if dtype is not None:
                    pieces = [p.to(dtype) for p in pieces]
                writers[i].write_pieces(name, pieces)
                if writers[i].complete:
                    writers[i].close()
            for src in sources:  # written: their checkpoint pages can leave memory
                release_pages(src)

        pending: list[Future] = []
        with _closing(writers), ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-writer") as pool:
            for unit, layer in tqdm(units(spec), desc="mg2hf", unit="layer", disable=not progress):
                # pieces are mostly views into the memory-mapped checkpoint: the writer copies them
                # straight to the shard, so each byte is copied once
                tensors, pp_rank, names = unit_to_hf_pieces(spec, unit, layer, get_mg, tp, pp, where)
                for t in range(tp):
                    consumed[(t, pp_rank)].update(names)
                pending.append(pool.submit(write_unit, tensors, list(touched)))
                touched.clear()
                while len(pending) > 2:  # bounded window: at most two units in flight
                    pending.pop(0).result()
            for f in pending:
                f.result()
        unfinished = [shard_names[i] for i in range(len(shards)) if i not in writers or not writers[i].complete]
        if unfinished:
            raise ConversionError(f"internal error: shards not completed: {unfinished}")
        check_tied_copy(
            spec,
            tp,
            pp,
            lambda t: states[(t, pp - 1)].get("output_layer.weight"),
            lambda t: states[(t, 0)]["embedding.word_embeddings.weight"],
            consumed,
        )
        for key, state in states.items():
            check_mg_leftovers(state.keys(), consumed[key], where=where(*key))
        hf_files.write_index(tmp, shards, shard_names)
        out_dtype = dtype or planned[0].dtype
        copied = hf_files.copy_template_files(template, tmp, out_dtype)
    return Mg2HfResult(
        out_dir=Path(out_dir).resolve(),
        iter_dir=layout.iter_dir,
        tp=tp,
        pp=pp,
        num_tensors=len(planned),
        shard_files=shard_names,
        copied_files=copied,
        seconds=time.perf_counter() - start,
    )
