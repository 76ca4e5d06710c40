"""CLI verbs `build-index`, `adopt-index`, `serve-retriever` and `audit-index` (see rlinf_ext/cli.py)."""

from __future__ import annotations

import argparse
import sys

from .config import AdoptConfig, AuditConfig, BuildConfig, ServerConfig, add_dataclass_arguments, from_args

CONFIGS = {
    "build-index": BuildConfig,
    "adopt-index": AdoptConfig,
    "serve-retriever": ServerConfig,
    "audit-index": AuditConfig,
}


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    if verb not in CONFIGS:  # pragma: no cover - the verb table only routes these here
        raise ValueError(f"unknown verb {verb}")
    add_dataclass_arguments(parser, CONFIGS[verb])


def run(verb: str, args: argparse.Namespace) -> int:
    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from .corpus import CorpusError
    from .metadata import IndexMismatchError

    try:
        if verb == "build-index":
            # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
            from .build import build_index

            meta = build_index(from_args(BuildConfig, args))
            print(
                f"index written to {args.out}: {meta.retriever}, {meta.passages} passages"
                + (f", faiss {meta.faiss_type}, dim {meta.dim}" if meta.dim else "")
            )
            return 0
        if verb == "adopt-index":
            # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
            from .adopt import adopt_index, format_summary

            print(format_summary(adopt_index(from_args(AdoptConfig, args)), args.out))
            return 0
        if verb == "audit-index":
            # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
            from .audit_run import audit_index, format_record

            print(format_record(audit_index(from_args(AuditConfig, args)), args.index))
            return 0
        # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
        from .server import serve

        return serve(from_args(ServerConfig, args))
    except (CorpusError, IndexMismatchError, ValueError, OSError) as e:
        print(f"rlinf-ext {verb}: error: {e}", file=sys.stderr)
        return 1
