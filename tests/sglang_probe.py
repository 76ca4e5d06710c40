"""Build sglang's real ``ServerArgs`` in a process of its own (``tests/sglang_source.py:server_args_errors``).

    python tests/sglang_probe.py SGLANG_SOURCE_DIR < [kwargs, ...] (JSON)

Prints one JSON line: per ``kwargs``, None where ``ServerArgs(**kwargs)`` was built, else the error. The folder is
appended to ``sys.path`` (the venv's packages win over the dependencies installed beside sglang), and it runs
apart from the tests because importing ``sglang`` patches transformers in place.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    sys.path.append(sys.argv[1])
    kwargs_list = json.load(sys.stdin)
    import sglang
    from sglang.srt.server_args import ServerArgs

    if not os.path.realpath(sglang.__file__).startswith(os.path.realpath(sys.argv[1])):
        raise SystemExit(f"imported sglang from {sglang.__file__}, not from {sys.argv[1]}")

    errors = []
    for kwargs in kwargs_list:
        try:
            ServerArgs(**kwargs)
            errors.append(None)
        except Exception as exc:  # reported to the test, which names the kwargs
            errors.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps(errors))


if __name__ == "__main__":
    main()
