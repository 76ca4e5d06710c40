"""`rlinf-ext preprocess`: Search-R1 parquet / RLinf jsonl QA files -> RLinf prompt jsonl, or FVQA parquet
(MMSearch-R1) -> FVQA parquet with canonical images."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

FORMATS = ("auto", "searchr1", "fvqa")


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=None,
        help="Prompt YAML (e.g. examples/searchr1/prompt.yaml); defaults to the Search-R1 base template",
    )
    parser.add_argument(
        "--input", nargs="+", required=True, help="Input files: Search-R1 .parquet, RLinf .jsonl, or FVQA .parquet"
    )
    parser.add_argument("--output", required=True, help="Output path (.jsonl for text QA, .parquet for FVQA)")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="auto: FVQA when the parquet has images/reward_model/data_id columns, else Search-R1",
    )
    parser.add_argument("--tokenizer", default=None, help="Tokenizer directory (text QA: chat template and lengths)")
    tools = parser.add_mutually_exclusive_group()
    tools.add_argument(
        "--tools",
        default=None,
        help="Comma-separated tools (as in agentloop.<agent>.tools, e.g. search,mypkg.tools:Calc) "
        "whose instruction sentences fill {tool_instructions} in the template; overrides the "
        "YAML's tools",
    )
    tools.add_argument(
        "--experiment",
        default=None,
        help="An experiment YAML or name: its agent's configured tools fill {tool_instructions}",
    )
    parser.add_argument("--max-prompt-length", type=int, default=None, help="Override the YAML's max_prompt_length")
    parser.add_argument(
        "--image-min-pixels",
        type=int,
        default=512 * 512,
        help="FVQA: canonical images have at least this many pixels (MMSearch-R1: 512*512)",
    )
    parser.add_argument(
        "--image-max-pixels",
        type=int,
        default=672 * 672 * 2,
        help="FVQA: canonical images have at most this many pixels (MMSearch-R1: 672*672*2)",
    )
    parser.add_argument("--no-progress", action="store_true", help="Hide the progress bar")


def detect_format(inputs: list[Path]) -> str:
    """fvqa when every input is an FVQA parquet, searchr1 when none is; a mix is an error."""
    import pyarrow.parquet as pq

    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.data.fvqa import is_fvqa_table

    kinds = {p.suffix == ".parquet" and p.is_file() and is_fvqa_table(pq.read_schema(p).names) for p in inputs}
    if kinds == {True, False}:
        raise ValueError("the inputs mix FVQA and text QA files; preprocess them in separate calls")
    return "fvqa" if kinds == {True} else "searchr1"


def _run_fvqa(args: argparse.Namespace) -> str:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.data.fvqa import preprocess_fvqa

    output = Path(args.output)
    if output.suffix != ".parquet":
        raise ValueError(f"FVQA output must be a .parquet file, got {output}")
    report = preprocess_fvqa([Path(p) for p in args.input], output, args.image_min_pixels, args.image_max_pixels)
    return report.summary(output)


def _run_text(args: argparse.Namespace) -> str:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from transformers import AutoTokenizer

    from rlinf_ext.data.preprocess import PreprocessError, preprocess_files
    from rlinf_ext.data.prompt_config import load_prompt_config

    if not args.tokenizer:
        raise PreprocessError("--tokenizer is required for text QA files (chat template and prompt lengths)")
    tools = [t.strip() for t in args.tools.split(",") if t.strip()] if args.tools else None
    if args.experiment:
        # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
        from rlinf_ext.config import load_config
        from rlinf_ext.protocol.agents import agent_tools

        # not strict: a data path left ??? until this very file exists must not stop its preprocessing
        tools = agent_tools(load_config(args.experiment, strict=False))
    cfg = load_prompt_config(args.config, max_prompt_length=args.max_prompt_length, tools=tools)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if cfg.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise PreprocessError(
            f"tokenizer {args.tokenizer} has no chat template; set apply_chat_template: "
            "false in the prompt YAML or use a chat tokenizer"
        )
    output = Path(args.output)
    report = preprocess_files([Path(p) for p in args.input], output, cfg, tokenizer, show_progress=not args.no_progress)
    return report.summary(output)


def run(verb: str, args: argparse.Namespace) -> int:
    try:
        fmt = args.format if args.format != "auto" else detect_format([Path(p) for p in args.input])
        summary = _run_fvqa(args) if fmt == "fvqa" else _run_text(args)
    except (ValueError, OSError) as exc:  # PreprocessError, FVQAError and ImageError are ValueErrors
        print(f"rlinf-ext preprocess: {exc}", file=sys.stderr)
        return 1
    print(summary)
    return 0
