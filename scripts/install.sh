#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install rlinf_ext into it.
#   bash scripts/install.sh [--dev] [--gpu [--faiss-gpu]] [--venv DIR]
# CPU (default): torch==2.13.0 first on purpose: an unpinned torch would pull several GB of CUDA wheels.
# --gpu (a GPU node with the CUDA toolkit and cuDNN headers): torch==2.6.0 (sglang 0.4.6.post5's pin), the `gpu`
#   extra (RLinf's SGLang stack, torch-memory-saver, Transformer Engine's core), then Transformer Engine's PyTorch
#   extension built against that torch (--no-build-isolation: an isolated build would compile it against another
#   torch). `python scripts/check_gpu_extras.py` proves on any machine that these pins resolve.
# --faiss-gpu: swap faiss-cpu for faiss-gpu-cu12 (both install the `faiss` package; the one installed last wins,
#   so faiss-cpu is removed first). A later `pip install -e .` brings faiss-cpu back over it: run this again.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$here/.venv"
extras=()
gpu=0
faiss_gpu=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) extras+=(dev) ;;
    --gpu) gpu=1; extras+=(gpu) ;;
    --faiss-gpu) faiss_gpu=1 ;;
    --venv) venv="$2"; shift ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (use --dev, --gpu, --faiss-gpu or --venv DIR)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$faiss_gpu" = 1 ] && [ "$gpu" = 0 ]; then
  echo "install.sh: --faiss-gpu needs --gpu (faiss-gpu-cu12 runs on the GPU stack's CUDA 12 libraries)" >&2; exit 2
fi
extra=""
if [ ${#extras[@]} -gt 0 ]; then extra="[$(IFS=,; echo "${extras[*]}")]"; fi
python_bin="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "[install] creating virtual environment $venv"
  "$python_bin" -m venv "$venv"
fi
py="$venv/bin/python"
pin() {  # a top-level string constant of setup.py
  "$py" -c "import ast,sys; t=ast.parse(open(sys.argv[1]).read()); print(next(ast.literal_eval(n.value) for n in t.body if isinstance(n, ast.Assign) and n.targets[0].id == sys.argv[2]))" "$here/setup.py" "$1"
}
"$py" -m pip install -q --upgrade pip
if [ "$gpu" = 1 ]; then
  echo "[install] torch==2.6.0 (CUDA 12.4 build: sglang 0.4.6.post5's pin)"
  "$py" -m pip install -q torch==2.6.0
else
  echo "[install] torch==2.13.0 (CPU build on this machine)"
  "$py" -m pip install -q torch==2.13.0
fi
echo "[install] rlinf_ext$extra and its dependencies (rlinf==0.3.0, transformers==4.51.1, megatron-core, faiss-cpu, ...)"
"$py" -m pip install -q -e "$here$extra"
if [ "$gpu" = 1 ]; then
  te_torch="$(pin TE_TORCH_REQUIREMENT)"
  echo "[install] $te_torch, built against the installed torch (needs nvcc and cuDNN headers; minutes)"
  "$py" -m pip install -q --no-build-isolation "$te_torch"
fi
if [ "$faiss_gpu" = 1 ]; then
  faiss="$(pin FAISS_GPU_REQUIREMENT)"
  echo "[install] $faiss in place of faiss-cpu"
  "$py" -m pip uninstall -q -y faiss-cpu
  "$py" -m pip install -q "$faiss"
fi
echo "[install] done: activate with 'source $venv/bin/activate'"
