"""sglang 0.5.23's own classes, run in a process of their own (``tests/support/sglang_source.py:SGLangSource.probe``).

    python tests/support/sglang_probe.py SGLANG_SOURCE_DIR VERSION < {"server_args": [kwargs, ...], "banned": {...}} (JSON)

Prints one JSON line:
- ``server_args``: per ``kwargs``, None where sglang's real ``ServerArgs(**kwargs)`` was built, else the error;
- ``banned`` (``{"custom_params": ..., "vocab": n, "rows": k}``): rlinf_ext's ``disallowed_tokens_processor()``,
  loaded as sglang's scheduler loads a request's processor (``CustomLogitProcessor.from_str``) and run on ``rows``
  rows of zero logits with each row's ``custom_params`` (``SamplingBatchInfo``): the ids it set to -inf per row.
The folder is appended to ``sys.path`` (the venv's packages win over the dependencies installed beside sglang), and
this runs apart from the tests because importing ``sglang`` patches transformers in place.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    folder = sys.argv[1]
    sys.path.insert(
        0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )  # this checkout's rlinf_ext
    sys.path.append(folder)
    request = json.load(sys.stdin)
    import sglang

    if sglang.__version__ != sys.argv[2]:  # the folder's, or the SGLang profile's own install of the same release
        raise SystemExit(f"imported sglang {sglang.__version__} from {sglang.__file__}, not {sys.argv[2]}")
    out: dict = {}
    if "server_args" in request:
        from sglang.srt.server_args import ServerArgs

        errors = []
        for kwargs in request["server_args"]:
            try:
                ServerArgs(**kwargs)
                errors.append(None)
            except Exception as exc:  # reported to the test, which names the kwargs
                errors.append(f"{type(exc).__name__}: {exc}")
        out["server_args"] = errors
    if "banned" in request:
        import torch
        from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

        from rlinf_ext.generation.sglang_vl import disallowed_tokens_processor

        banned = request["banned"]
        processor = CustomLogitProcessor.from_str(disallowed_tokens_processor())
        logits = processor(torch.zeros(banned["rows"], banned["vocab"]), [banned["custom_params"]] * banned["rows"])
        out["banned"] = [torch.nonzero(torch.isinf(row)).flatten().tolist() for row in logits]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
    os._exit(0)  # the answer is out: no teardown of sglang's stack
