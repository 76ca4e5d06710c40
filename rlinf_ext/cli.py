"""`rlinf-ext` command line.

Each verb lives in the module that implements it. The table below holds only names and help text so that
`rlinf-ext --help` is instant; a verb's module (which may import torch) is imported only when that verb
runs. A verb module exposes ``add_arguments(verb, parser)`` and ``run(verb, args) -> int``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys

# verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "validate": ("rlinf_ext.config.commands", "Check an experiment YAML (all errors at once); exit 1 if invalid."),
    "show": ("rlinf_ext.config.commands", "Print the fully resolved experiment YAML."),
    "plan": ("rlinf_ext.config.commands", "Print the placement and the batch arithmetic of an experiment."),
    "keys": ("rlinf_ext.config.reference", "Print the config keys under a prefix with type, default and help."),
    "make-tiny-assets": (
        "rlinf_ext.assets.core.commands",
        "Generate the offline tiny corpus, QA files, tokenizer and models.",
    ),
    "build-index": ("rlinf_ext.retrieval.commands", "Build a BM25 or dense (faiss) index over a jsonl corpus."),
    "adopt-index": (
        "rlinf_ext.retrieval.commands",
        "Serve a downloaded faiss index file (Search-R1's e5_Flat.index) without re-encoding.",
    ),
    "serve-retriever": ("rlinf_ext.retrieval.commands", "Serve /retrieve, /access and /health over a built index."),
    "audit-index": ("rlinf_ext.retrieval.commands", "Recall@k and latency of a dense index against a Flat one."),
    "preprocess": ("rlinf_ext.data.commands", "Turn Search-R1 parquet / RLinf jsonl QA data into prompt jsonl."),
    "convert": ("rlinf_ext.convert.commands", "Convert checkpoints: `convert mg2hf` or `convert hf2mg`."),
    "train": ("rlinf_ext.runner.commands", "Run a training experiment from a YAML (RLinf cluster, rollout, actor)."),
    "eval": ("rlinf_ext.runner.commands", "Evaluate a model on the benchmark files of an eval YAML."),
    "eval-report": ("rlinf_ext.eval.commands", "Print a side-by-side table of one or more evaluation runs."),
}


def _top_level_help() -> str:
    width = max(len(v) for v in VERBS)
    lines = ["usage: rlinf-ext VERB [options]", "", "verbs:"]
    for verb, (_, text) in VERBS.items():
        lines.append(f"  {verb.ljust(width)}  {text}")
    lines += ["", "Run `rlinf-ext VERB --help` for the options of one verb."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_top_level_help())
        return 0
    verb = argv[0]
    if verb not in VERBS:
        close = difflib.get_close_matches(verb, list(VERBS), n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        print(f"rlinf-ext: unknown verb '{verb}'.{hint}\n\n{_top_level_help()}", file=sys.stderr)
        return 2
    module_name, text = VERBS[verb]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"rlinf-ext {verb}", description=text)
    module.add_arguments(verb, parser)
    args = parser.parse_args(argv[1:])
    return int(module.run(verb, args) or 0)


if __name__ == "__main__":
    sys.exit(main())
