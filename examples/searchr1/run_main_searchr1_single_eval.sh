#!/usr/bin/env bash
# Evaluate a model on the Search-R1 benchmarks as one eval YAML says (per-benchmark EM/subEM/F1 table).
#   bash examples/searchr1/run_main_searchr1_single_eval.sh [CONFIG_NAME|CONFIG.yaml] [key=value ...]
# CONFIG_NAME is a file under examples/searchr1/config/ without .yaml (default: qwen2.5-3b-tool-1node-eval,
# a converted HF checkpoint on the seven benchmarks; set RLINF_EXT_EVAL_MODEL); `tiny-cpu-eval` runs on a CPU.
# Writes results.{json,md,csv} and generations.jsonl under runner.output_dir/runner.experiment_name; a rerun
# resumes (questions already in generations.jsonl are skipped). Runs from any directory.
# Python: the active virtual environment, else the repo's .venv, else python3 on PATH.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

config="qwen2.5-3b-tool-1node-eval"
if [ $# -gt 0 ]; then
  case "$1" in
    -h|--help) sed -n 2,8p "${BASH_SOURCE[0]}"; exit 0 ;;
    *=*) ;;                       # only overrides given: keep the default config
    *) config="$1"; shift ;;
  esac
fi

if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  python_bin="$VIRTUAL_ENV/bin/python"
elif [ -x "$repo/.venv/bin/python" ]; then
  python_bin="$repo/.venv/bin/python"
else
  python_bin="$(command -v python3 || command -v python)"
fi

exec "$python_bin" "$repo/launchers/eval.py" "$config" "$@"
