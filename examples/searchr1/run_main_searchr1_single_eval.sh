#!/usr/bin/env bash
# Evaluate a model on the Search-R1 benchmarks as one eval YAML says (per-benchmark EM/subEM/F1 table).
#   bash examples/searchr1/run_main_searchr1_single_eval.sh [CONFIG_NAME|CONFIG.yaml] [key=value ...]
# CONFIG_NAME is a file under examples/searchr1/config/ without .yaml (default: qwen2.5-3b-tool-1node-eval,
# a converted HF checkpoint on the seven benchmarks; set RLINF_EXT_EVAL_MODEL); `tiny-cpu-eval` runs on a CPU.
# Writes results.{json,md,csv} and generations.jsonl under runner.output_dir/runner.experiment_name; a rerun
# resumes (questions already in generations.jsonl are skipped). Runs from any directory.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/launch_common.sh"
rlinf_ext_run_launcher "${BASH_SOURCE[0]}" qwen2.5-3b-tool-1node-eval eval "$@"
