"""Hugging Face checkpoint files: lazy reading, streaming sharded safetensors writing, template copying,
and atomic output folders."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from rlinf_ext.convert.mapping import ConversionError
from rlinf_ext.models.dtypes import hf_name_of

INDEX_FILE = "model.safetensors.index.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")
SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
}


# --------------------------------------------------------------------------- reading


class HFReader:
    """Tensors of a HF model folder by name, read one at a time (safetensors are memory-mapped)."""

    def __init__(self, model_dir: str | Path):
        from safetensors import safe_open

        self.dir = Path(model_dir)
        if not self.dir.is_dir():
            raise ConversionError(f"{self.dir}: not a directory (pass the HF model folder)")
        self._where: dict[str, Path] = {}
        self._handles: dict[Path, object] = {}
        self._bin: dict[str, torch.Tensor] = {}
        files = sorted(self.dir.glob("*.safetensors"))
        index = self.dir / INDEX_FILE
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            for name, fname in weight_map.items():
                path = self.dir / fname
                if not path.is_file():
                    raise ConversionError(f"{index} lists {fname} for {name}, but {path} does not exist")
                self._where[name] = path
        elif files:
            for path in files:
                with safe_open(str(path), framework="pt") as f:
                    for name in f.keys():
                        if name in self._where:
                            raise ConversionError(f"{name} appears in both {self._where[name].name} and {path.name}")
                        self._where[name] = path
        else:
            bins = sorted(self.dir.glob("pytorch_model*.bin"))
            if not bins:
                raise ConversionError(f"{self.dir}: no *.safetensors or pytorch_model*.bin weight files")
            for path in bins:
                sd = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
                for name, t in sd.items():
                    self._bin[name] = t
                    self._where[name] = path
        self._safe_open = safe_open

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise ConversionError(f"{self.dir}: no tensor named {name}")
        if name in self._bin:
            return self._bin[name]
        path = self._where[name]
        handle = self._handles.get(path)
        if handle is None:
            handle = self._safe_open(str(path), framework="pt").__enter__()
            self._handles[path] = handle
        return handle.get_tensor(name)

    def read_all(self) -> dict[str, torch.Tensor]:
        """Every tensor of the folder by name (what the actor loads at start), then the files are closed."""
        try:
            return {name: self.get(name) for name in self.names()}
        finally:
            self.close()

    def close(self) -> None:
        for h in self._handles.values():
            h.__exit__(None, None, None)
        self._handles.clear()


# --------------------------------------------------------------------------- streaming writer


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


def plan_shards(tensors: list[PlannedTensor], max_shard_bytes: int) -> list[list[PlannedTensor]]:
    """Group tensors in order into shards of at most ``max_shard_bytes`` (a bigger tensor gets its own)."""
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return [s for s in shards if s]


def shard_file_names(n: int) -> list[str]:
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


class SafetensorsStreamWriter:
    """Writes one safetensors file tensor by tensor: the header is computed from the plan up front,
    so only the tensor being written is in memory (safetensors.torch.save_file needs them all)."""

    def __init__(self, path: Path, planned: list[PlannedTensor]):
        self.path = path
        self.planned = planned
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for t in planned:
            if t.dtype not in SAFETENSORS_DTYPES:
                raise ConversionError(f"{t.name}: dtype {t.dtype} cannot be stored in safetensors here")
            header[t.name] = {
                "dtype": SAFETENSORS_DTYPES[t.dtype],
                "shape": list(t.shape),
                "data_offsets": [offset, offset + t.nbytes],
            }
            offset += t.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # align the data section, as the reference writer does
        self._data_bytes = offset
        self._next = 0
        self._f = open(path, "wb")
        self._f.write(struct.pack("<Q", len(raw)))
        self._f.write(raw)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        self.write_pieces(name, [tensor])

    def write_pieces(self, name: str, pieces: list[torch.Tensor]) -> None:
        """Write a tensor given as pieces whose dim-0 concatenation is the tensor (views are fine)."""
        if self._next >= len(self.planned) or self.planned[self._next].name != name:
            expected = self.planned[self._next].name if self._next < len(self.planned) else "nothing"
            raise ConversionError(f"{self.path.name}: got {name} but the plan expects {expected}")
        plan = self.planned[self._next]
        rows = sum(p.shape[0] for p in pieces) if pieces and pieces[0].dim() else None
        shape = (rows, *pieces[0].shape[1:]) if rows is not None else tuple(pieces[0].shape)
        tails_ok = all(tuple(p.shape[1:]) == tuple(pieces[0].shape[1:]) for p in pieces)
        if any(p.dtype != plan.dtype for p in pieces) or shape != plan.shape or not tails_ok:
            raise ConversionError(f"{name}: produced {pieces[0].dtype} {shape}, planned {plan.dtype} {plan.shape}")
        for p in pieces:
            data = p.contiguous().reshape(-1).view(torch.uint8).numpy()
            self._f.write(memoryview(data))
        self._next += 1

    @property
    def complete(self) -> bool:
        return self._next == len(self.planned)

    def abort(self) -> None:
        """Close the file without the completeness check (the output folder is being discarded)."""
        self._f.close()

    def close(self) -> None:
        self._f.close()
        if not self.complete:
            raise ConversionError(
                f"{self.path.name}: only {self._next} of {len(self.planned)} planned tensors were written"
            )


def write_index(out_dir: Path, shards: list[list[PlannedTensor]], names: list[str]) -> None:
    weight_map = {t.name: fname for shard, fname in zip(shards, names) for t in shard}
    total = sum(t.nbytes for shard in shards for t in shard)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


# --------------------------------------------------------------------------- templates and output


def is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES) or name.endswith(".index.json")


def copy_template_files(template: Path, out_dir: Path, dtype: torch.dtype | None) -> list[str]:
    """Copy config, generation config, tokenizer and other small files — never weight files.

    ``config.json`` gets ``dtype`` (transformers 5's key, which wins over ``torch_dtype`` when both are there) and
    ``torch_dtype`` (4.x's key, for older readers) set to the written dtype.
    """
    copied = []
    for src in sorted(template.iterdir()):
        if not src.is_file() or is_weight_file(src.name) or src.name.startswith("."):
            continue
        shutil.copy2(src, out_dir / src.name)
        copied.append(src.name)
    cfg_path = out_dir / "config.json"
    if cfg_path.is_file() and dtype is not None:
        cfg = json.loads(cfg_path.read_text())
        name = hf_name_of(dtype) or cfg.get("dtype") or cfg.get("torch_dtype")
        cfg["dtype"] = cfg["torch_dtype"] = name
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return copied


def check_output_dir(out: Path, force: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ConversionError(f"{out}: already exists and is not empty; choose another --out or pass --force")


@contextlib.contextmanager
def atomic_output_dir(out: str | Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder next to ``out``; on success it is renamed to ``out``, on any error
    removed, so an interrupted conversion never leaves a complete-looking ``out``."""
    out = Path(out).resolve()
    check_output_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)
