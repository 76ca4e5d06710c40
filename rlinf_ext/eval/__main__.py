"""`python -m rlinf_ext.eval CONFIG [key=value ...]`: in-process evaluation against a running retrieval server.

`rlinf-ext eval` (the launcher) is the full path: it also starts the retrieval server and, on GPUs, the
rollout group. This entry runs the CPU `hf` engine in this process and needs `tools.search.server_addr`.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlinf_ext.eval", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="eval YAML: a path or a name under examples/searchr1/config/ or examples/mmsearch_r1/config/")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. data.data_size=4")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    args = parser.parse_args(argv)

    # lazy: a CLI verb module; `rlinf-ext --help` must not import what the verb needs
    from rlinf_ext.config.loader import ConfigError, load_config, validate
    from rlinf_ext.eval.core.runner import EvalError
    from rlinf_ext.eval.entry import run_evaluation

    try:
        cfg = load_config(args.config, args.overrides)
        issues = validate(cfg, check_paths=True)
        if issues:
            raise ConfigError(args.config, issues)
        if not cfg.tools.search.server_addr and cfg.tools.search.backend == "local":
            raise EvalError(
                "tools.search.server_addr is not set: start a server (`rlinf-ext serve-retriever ...`) and pass "
                "tools.search.server_addr=HOST:PORT, or use `rlinf-ext eval`, which launches one"
            )
        run_evaluation(cfg, show_progress=not args.no_progress)
    except (ConfigError, EvalError, FileNotFoundError, ValueError) as exc:
        print(f"python -m rlinf_ext.eval: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
