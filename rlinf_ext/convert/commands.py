"""``rlinf-ext convert mg2hf|hf2mg``: checkpoint conversion between Megatron-core and Hugging Face."""

from __future__ import annotations

import argparse
import sys


def _size(text: str) -> int:
    """'5GB', '500MB', '123' (bytes) → bytes."""
    units = {"KB": 1024, "MB": 1024**2, "GB": 1024**3}
    t = text.strip().upper()
    for suffix, mult in units.items():
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="direction", required=True, metavar="{mg2hf,hf2mg}")

    mg = sub.add_parser(
        "mg2hf",
        help="Megatron checkpoint (any TP/PP) -> HF sharded safetensors",
        description="Merge a Megatron checkpoint (RLinf's global_step_N/actor, its iter_XXXXXXX folder, or a "
        "folder with latest_checkpointed_iteration.txt) into HF safetensors shards + index. Config, generation "
        "config and tokenizer files are copied from --hf-template (never its weights).",
    )
    mg.add_argument("--mg", required=True, help="Megatron checkpoint folder (actor dir or iteration dir)")
    mg.add_argument("--out", required=True, help="output HF model folder (must not exist, unless --force)")
    mg.add_argument("--hf-template", required=True, help="the original HF model folder (config.json, tokenizer)")
    mg.add_argument(
        "--dtype",
        choices=["bf16", "fp16", "fp32"],
        default=None,
        help="dtype of the written weights (default: keep the checkpoint's, bit-exact)",
    )
    mg.add_argument("--max-shard-size", type=_size, default="5GB", help="largest safetensors shard (default 5GB)")
    mg.add_argument(
        "--verify",
        action="store_true",
        help="after converting, compare logits of the HF result and the Megatron-core model on fixed "
        "prompts (loads both models in fp32 on CPU) and print the max abs difference",
    )
    mg.add_argument(
        "--verify-tol", type=float, default=None, help="max abs logit difference --verify accepts (default 5e-3)"
    )
    mg.add_argument("--force", action="store_true", help="replace --out if it exists")
    mg.add_argument("--quiet", action="store_true", help="no progress bar")

    hf = sub.add_parser(
        "hf2mg",
        help="HF model -> Megatron checkpoint for TP/PP",
        description="Split a HF Qwen2/Qwen2.5 model into the Megatron torch-format layout: "
        "latest_checkpointed_iteration.txt + release/mp_rank_XX[_YYY]/model_optim_rng.pt.",
    )
    hf.add_argument("--hf", required=True, help="HF model folder (config.json + safetensors)")
    hf.add_argument("--out", required=True, help="output Megatron checkpoint folder (must not exist, unless --force)")
    hf.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    hf.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    hf.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None, help="dtype to store (default: keep)")
    hf.add_argument(
        "--layernorm-names",
        choices=["te", "local"],
        default="te",
        help="write Transformer-Engine fused layer-norm names (Megatron on GPU, default) or local-spec names",
    )
    hf.add_argument(
        "--iteration",
        type=int,
        default=None,
        help="write iter_{N:07d} and N in the tracker file (N > 0) instead of 'release'",
    )
    hf.add_argument(
        "--padded-vocab-size",
        type=int,
        default=None,
        help="embedding rows in Megatron (default: the HF vocab_size, as RLinf sets it)",
    )
    hf.add_argument("--force", action="store_true", help="replace --out if it exists")
    hf.add_argument("--quiet", action="store_true", help="no progress bar")


def run(verb: str, args: argparse.Namespace) -> int:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.convert.mapping import ConversionError
    from rlinf_ext.models.dtypes import dtype_of_precision

    dtype = dtype_of_precision(args.dtype, "--dtype") if args.dtype else None
    try:
        if args.direction == "mg2hf":
            return _run_mg2hf(args, dtype)
        return _run_hf2mg(args, dtype)
    except (ConversionError, FileNotFoundError) as e:
        print(f"rlinf-ext convert {args.direction}: error: {e}", file=sys.stderr)
        return 1


def _run_mg2hf(args: argparse.Namespace, dtype) -> int:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.convert.mg2hf import convert_mg_to_hf

    res = convert_mg_to_hf(
        args.mg,
        args.out,
        args.hf_template,
        dtype=dtype,
        max_shard_bytes=args.max_shard_size,
        force=args.force,
        progress=not args.quiet,
    )
    print(
        f"mg2hf: {res.iter_dir} (TP={res.tp}, PP={res.pp}) -> {res.out_dir}: {res.num_tensors} tensors in "
        f"{len(res.shard_files)} shard(s), copied {', '.join(res.copied_files) or 'no files'} from the template, "
        f"{res.seconds:.1f}s"
    )
    if args.verify:
        # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
        from rlinf_ext.convert.verify import DEFAULT_TOLERANCE, verify_conversion

        tol = args.verify_tol if args.verify_tol is not None else DEFAULT_TOLERANCE
        v = verify_conversion(args.mg, res.out_dir, tolerance=tol)
        verdict = "OK" if v.ok else "FAILED"
        print(
            f"verify: max abs logit diff HF vs Megatron-core = {v.max_abs_diff:.3e} over {v.num_tokens} tokens of "
            f"{v.num_prompts} prompts (tolerance {v.tolerance:g}) {verdict}"
        )
        return 0 if v.ok else 3
    return 0


def _run_hf2mg(args: argparse.Namespace, dtype) -> int:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.convert.hf2mg import convert_hf_to_mg

    res = convert_hf_to_mg(
        args.hf,
        args.out,
        tp=args.tp,
        pp=args.pp,
        dtype=dtype,
        te_layernorm_names=args.layernorm_names == "te",
        padded_vocab_size=args.padded_vocab_size,
        iteration=args.iteration,
        force=args.force,
        progress=not args.quiet,
    )
    print(
        f"hf2mg: {args.hf} -> {res.out_dir} (TP={res.tp}, PP={res.pp}): {len(res.rank_files)} rank file(s), {res.seconds:.1f}s"
    )
    return 0
