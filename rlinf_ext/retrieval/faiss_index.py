"""faiss index files: type presets, memory-mapped or in-RAM reading with checks, search parameters, GPU copy.

Memory-mapping uses faiss's ``IO_FLAG_MMAP_IFC`` (faiss >= 1.11): the codes of Flat, SQ, PQ, HNSW and IVF
indexes become a zero-copy view of the file, so a 64 GB index opens in well under a second and its pages are
page cache the kernel can evict, not the process's own memory.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import faiss

from .config import parse_gpu_ids
from .corpus import file_fingerprint
from .metadata import IndexMetadata, IndexMismatchError

FAISS_NAME = "faiss.index"
MMAP_FLAGS = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY

# --faiss-type presets (anything else is passed to faiss.index_factory as is).
#   flat       exact inner product, float32 (the peers' e5_Flat).
#   flat-fp16  exact search over fp16 codes (scalar quantiser): half the memory.
#   approx     the CPU default approximate index: IVF lists of 4-bit fast-scan PQ codes, whose candidates are
#              re-scored exactly against the fp16 vectors stored in the same file (faiss IndexRefine), so the
#              top-k is exact whenever the true top-k is among the candidates.
PRESETS = ("flat", "flat-fp16", "approx")
EXACT_TYPE = "Flat"


def ivf_lists(passages: int) -> int:
    """IVF list count: the power of two nearest 2*sqrt(N), with >= 39 training points per list (faiss's minimum).

    2*sqrt(N) rather than faiss's usual 4-16*sqrt(N): with fast-scan codes the scan is cheap and the exact re-rank
    fixes the ranking, so finer lists buy little (1M x 768: nprobe 64 of 2048 lists reached recall@3 0.993), while
    k-means training costs grow with the list count squared (points per list x lists).
    """
    target = max(1.0, min(2 * math.sqrt(passages), passages / 39))
    return 2 ** max(0, round(math.log2(target)))


def resolve_faiss_type(name: str, passages: int, dim: int) -> str:
    """The faiss factory string of a preset (sized for ``passages`` x ``dim``), or ``name`` itself."""
    if name == "flat":
        return EXACT_TYPE
    if name == "flat-fp16":
        return "SQfp16"
    if name == "approx":
        return f"IVF{ivf_lists(passages)},PQ{max(1, dim // 2)}x4fs,Refine(SQfp16)"
    return name


def new_faiss_index(dim: int, faiss_type: str) -> faiss.Index:
    """``index_factory(dim, faiss_type, inner product)`` or a ValueError naming valid strings."""
    try:
        return faiss.index_factory(dim, faiss_type, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        first_line = str(e).strip().splitlines()[-1] if str(e).strip() else ""
        raise ValueError(
            f"faiss cannot build '{faiss_type}' for dim {dim} ({first_line}). Use a preset "
            f"({', '.join(PRESETS)}) or a factory string such as Flat, SQfp16, HNSW32, "
            "IVF4096,Flat or IVF4096,PQ96x4fs,Refine(SQfp16) (PQ needs dim divisible by its size)."
        ) from e


def write_faiss_index(index: faiss.Index, path: Path) -> str:
    """Write atomically (a reader never sees half a file); returns the file's fingerprint for the metadata."""
    tmp = path.with_name(path.name + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, path)
    return file_fingerprint(path)


def _refuse(path: Path, problem: str) -> IndexMismatchError:
    return IndexMismatchError(
        f"{path}: {problem}. Rebuild the index with `rlinf-ext build-index`, or for an "
        "adopted file rerun `rlinf-ext adopt-index` (or restore the file the metadata next to it "
        "was written for)."
    )


def read_faiss_index(path: str | os.PathLike, meta: IndexMetadata, *, in_ram: bool = False) -> tuple[faiss.Index, bool]:
    """Open ``path`` memory-mapped (default) or into RAM; returns ``(index, memory_mapped)``.

    Refused with an IndexMismatchError naming the file when it is missing, truncated, not a faiss index, or
    does not hold ``meta.passages`` vectors of ``meta.dim`` dimensions under inner product.
    """
    path = Path(path)
    if not path.is_file():
        missing = f"it links to {os.readlink(path)}, which is missing" if path.is_symlink() else "not found"
        raise _refuse(path, f"faiss index file {missing}")
    if meta.faiss_checksum is not None and file_fingerprint(path) != meta.faiss_checksum:
        raise _refuse(
            path,
            f"size/checksum differ from the ones recorded at build time ({meta.faiss_checksum}; "
            f"found {file_fingerprint(path)}): the file is truncated or another index",
        )
    mapped = not in_ram
    try:
        index = faiss.read_index(str(path), MMAP_FLAGS if mapped else 0)
    except RuntimeError as e:
        if not mapped:
            raise _refuse(path, f"not a readable faiss index ({_last_line(e)}): truncated or corrupt") from e
        try:  # an index type faiss cannot map: read it into RAM instead
            index, mapped = faiss.read_index(str(path)), False
        except RuntimeError:
            raise _refuse(path, f"not a readable faiss index ({_last_line(e)}): truncated or corrupt") from e
        print(f"{path}: faiss cannot memory-map this index type; loaded into RAM", flush=True)
    problems = []
    if meta.passages != index.ntotal:
        problems.append(f"it holds {index.ntotal} vectors but the metadata says {meta.passages} passages")
    if meta.dim is not None and meta.dim != index.d:
        problems.append(f"its vectors are {index.d}-d but the metadata says {meta.dim}-d")
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        problems.append("its metric is not inner product")
    if problems:
        raise _refuse(path, "does not match its metadata: " + "; ".join(problems))
    return index, mapped


def _last_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[-1] if text else type(e).__name__


def tunable_params(index: faiss.Index) -> dict[str, list[float]]:
    """faiss's own list of search parameters that apply to ``index`` and their candidate values (ascending)."""
    space = faiss.ParameterSpace()
    space.initialize(index)
    out = {}
    for i in range(space.parameter_ranges.size()):
        param = space.parameter_ranges.at(i)  # held in a variable: a temporary's `values` would be freed memory
        out[param.name] = sorted(param.values.at(j) for j in range(param.values.size()))
    return out


def apply_search_params(index: faiss.Index, params: dict[str, float], faiss_type: str = "", gpu: bool = False) -> None:
    """Set faiss search parameters (``{"nprobe": 64, "efSearch": 128, "k_factor_rf": 8}``) on ``index``."""
    space = faiss.GpuParameterSpace() if gpu else faiss.ParameterSpace()
    for name, value in params.items():
        try:
            space.set_index_parameter(index, name, float(value))
        except RuntimeError as e:
            takes = "see faiss's GpuParameterSpace" if gpu else ", ".join(tunable_params(index)) or "none"
            raise ValueError(
                f"search parameter {name}={value} does not apply to faiss index '{faiss_type}' "
                f"(it takes: {takes}); drop the option or build another index type"
            ) from e


def to_gpus(index: faiss.Index, gpus: str) -> faiss.Index:
    """Shard the (memory-mapped) index over the chosen GPUs in fp16 (faiss-GPU); not GPU-verified.

    The copy streams the mapped pages to the GPUs once. For a re-ranking index (IndexRefine) only the base
    index goes to the GPUs; the exact re-rank reads the mapped vectors on the CPU.
    """
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        raise ValueError(
            "--gpus asks for faiss-GPU but this faiss has no GPU support or sees no GPU (faiss-cpu, "
            "a base requirement, overwrites faiss-gpu when installed after it); fix: "
            "`bash scripts/install.sh --gpu --faiss-gpu` (removes faiss-cpu, then installs "
            "faiss-gpu-cu12), or drop --gpus"
        )
    concrete = faiss.downcast_index(index)
    if isinstance(concrete, faiss.IndexRefine):
        gpu_base = to_gpus(concrete.base_index, gpus)
        refined = faiss.IndexRefine(gpu_base, concrete.refine_index)
        refined.k_factor = concrete.k_factor
        refined.referenced = (gpu_base, concrete)  # keeps the Python wrappers (and so the C++ objects) alive
        return refined
    if "HNSW" in type(concrete).__name__:
        raise ValueError("HNSW indexes cannot run on faiss-GPU; serve them on CPU (drop --gpus)")
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True
    options.useFloat16 = True
    try:
        if gpus == "all":
            return faiss.index_cpu_to_all_gpus(index, co=options)
        ids = parse_gpu_ids(gpus, faiss.get_num_gpus())
        resources = [faiss.StandardGpuResources() for _ in ids]
        return faiss.index_cpu_to_gpu_multiple_py(resources, index, co=options, gpus=ids)
    except RuntimeError as e:
        raise ValueError(
            f"faiss-GPU cannot hold a {type(concrete).__name__} ({_last_line(e)}); serve it on CPU "
            "(drop --gpus) or build a Flat, IVF...,Flat or IVF...,PQ index for GPUs"
        ) from e
