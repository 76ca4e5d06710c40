"""`rlinf-ext preprocess`: Search-R1 parquet / RLinf jsonl QA files -> RLinf prompt jsonl."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="Prompt YAML (e.g. examples/searchr1/prompt.yaml); "
                        "defaults to the Search-R1 base template")
    parser.add_argument("--input", nargs="+", required=True, help="Input files: Search-R1 .parquet or RLinf .jsonl")
    parser.add_argument("--output", required=True, help="Output RLinf .jsonl path")
    parser.add_argument("--tokenizer", required=True, help="Tokenizer directory (chat template and lengths)")
    parser.add_argument("--max-prompt-length", type=int, default=None, help="Override the YAML's max_prompt_length")
    parser.add_argument("--no-progress", action="store_true", help="Hide the progress bar")


def run(verb: str, args: argparse.Namespace) -> int:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
# lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from transformers import AutoTokenizer

    from rlinf_ext.data.preprocess import PreprocessError, preprocess_files
    from rlinf_ext.data.prompt_config import load_prompt_config

    try:
        cfg = load_prompt_config(args.config, max_prompt_length=args.max_prompt_length)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        if cfg.apply_chat_template and not getattr(tokenizer, "chat_template", None):
            raise PreprocessError(f"tokenizer {args.tokenizer} has no chat template; set apply_chat_template: "
                                  "false in the prompt YAML or use a chat tokenizer")
        output = Path(args.output)
        report = preprocess_files([Path(p) for p in args.input], output, cfg, tokenizer,
                                  show_progress=not args.no_progress)
    except (PreprocessError, ValueError, OSError) as exc:
        print(f"rlinf-ext preprocess: {exc}", file=sys.stderr)
        return 1
    print(report.summary(output))
    return 0
