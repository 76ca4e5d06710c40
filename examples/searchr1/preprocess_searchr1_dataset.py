#!/usr/bin/env python
"""Turn Search-R1 parquet / RLinf jsonl QA files into RLinf prompt jsonl.

    python examples/searchr1/preprocess_searchr1_dataset.py --config examples/searchr1/prompt.yaml \
        --input data/nq_hotpotqa_train/train.parquet --output data/searchr1/train.jsonl --tokenizer MODEL_DIR

Same as `rlinf-ext preprocess ...` (this script is a thin wrapper around rlinf_ext.data.commands).
"""

import sys

from rlinf_ext.cli import main

if __name__ == "__main__":
    sys.exit(main(["preprocess", *sys.argv[1:]]))
