#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install rlinf_ext into it.
#   bash scripts/install.sh [--dev] [--venv DIR]
# torch==2.13.0 is installed first on purpose: an unpinned torch would pull several GB of CUDA wheels.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$here/.venv"
extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) extra="[dev]" ;;
    --venv) venv="$2"; shift ;;
    -h|--help) sed -n 2,4p "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (use --dev or --venv DIR)" >&2; exit 2 ;;
  esac
  shift
done
python_bin="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "[install] creating virtual environment $venv"
  "$python_bin" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
echo "[install] torch==2.13.0 (CPU build on this machine)"
"$venv/bin/python" -m pip install -q torch==2.13.0
echo "[install] rlinf_ext$extra and its dependencies (rlinf==0.3.0, transformers==4.51.1, megatron-core, faiss-cpu, ...)"
"$venv/bin/python" -m pip install -q -e "$here$extra"
echo "[install] done: activate with 'source $venv/bin/activate'"
