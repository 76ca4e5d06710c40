#!/usr/bin/env bash
# Evaluate a Qwen2.5-VL model with the MMSearch-R1 loop as one eval YAML says: a table per data source and
# category (accuracy, mean reward, image/text/mixed search ratios, search failure ratios).
#   bash examples/mmsearch/run_main_mmsearch_eval.sh [CONFIG_NAME|CONFIG.yaml] [key=value ...]
# CONFIG_NAME is a file under examples/mmsearch/config/ without .yaml (default: tiny-mm-cpu-eval, the tiny
# multimodal world on a CPU; its assets are generated on first use). Writes results.{json,md,csv} and
# generations.jsonl under runner.output_dir/runner.experiment_name; a rerun resumes. Runs from any directory.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../searchr1" && pwd)/launch_common.sh"
rlinf_ext_run_launcher "${BASH_SOURCE[0]}" tiny-mm-cpu-eval eval "$@"
