#!/usr/bin/env bash
# Train Search-R1 as one experiment YAML says.
#   bash examples/searchr1/run_main_searchr1_single.sh [CONFIG_NAME|CONFIG.yaml] [key=value ...]
# CONFIG_NAME is a file under examples/searchr1/config/ without .yaml (default: qwen2.5-3b-tool-1node,
# the reference run on 8xH100); `tiny-cpu` is the self-contained CPU experiment. Runs from any directory.
# Python: the active virtual environment, else the repo's .venv, else python3 on PATH.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/launch_common.sh"
rlinf_ext_run_launcher "${BASH_SOURCE[0]}" qwen2.5-3b-tool-1node train "$@"
