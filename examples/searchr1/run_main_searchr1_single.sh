#!/usr/bin/env bash
# Train Search-R1 as one experiment YAML says.
#   bash examples/searchr1/run_main_searchr1_single.sh [CONFIG_NAME|CONFIG.yaml] [key=value ...]
# CONFIG_NAME is a file under examples/searchr1/config/ without .yaml (default: qwen2.5-3b-tool-1node,
# the reference run on 8xH100); `tiny-cpu` is the self-contained CPU experiment. Runs from any directory.
# Python: the active virtual environment, else the repo's .venv, else python3 on PATH.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

config="qwen2.5-3b-tool-1node"
if [ $# -gt 0 ]; then
  case "$1" in
    -h|--help) sed -n 2,6p "${BASH_SOURCE[0]}"; exit 0 ;;
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

exec "$python_bin" "$repo/launchers/train.py" "$config" "$@"
