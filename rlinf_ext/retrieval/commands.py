"""CLI verbs `build-index` and `serve-retriever` (see rlinf_ext/cli.py)."""

from __future__ import annotations

import argparse
import sys

from .config import BuildConfig, ServerConfig, add_dataclass_arguments, from_args


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    if verb == "build-index":
        add_dataclass_arguments(parser, BuildConfig)
    elif verb == "serve-retriever":
        add_dataclass_arguments(parser, ServerConfig)
    else:  # pragma: no cover - the verb table only routes these two here
        raise ValueError(f"unknown verb {verb}")


def run(verb: str, args: argparse.Namespace) -> int:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from .corpus import CorpusError
    from .metadata import IndexMismatchError

    try:
        if verb == "build-index":
            # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
            from .build import build_index

            meta = build_index(from_args(BuildConfig, args))
            print(f"index written to {args.out}: {meta.retriever}, {meta.passages} passages"
                  + (f", faiss {meta.faiss_type}, dim {meta.dim}" if meta.dim else ""))
            return 0
        # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
        from .server import serve

        return serve(from_args(ServerConfig, args))
    except (CorpusError, IndexMismatchError, ValueError, OSError) as e:
        print(f"rlinf-ext {verb}: error: {e}", file=sys.stderr)
        return 1
