#!/bin/sh
# Convert a Hugging Face Qwen2/Qwen2.5 model to a Megatron checkpoint for a TP/PP layout.
# POSIX sh: runs with bash or sh, from any directory. Wraps `rlinf-ext convert hf2mg`.
set -eu

usage() {
    cat <<USAGE
usage: hf2mg_3b.sh <hf_dir> <mg_out> [tp] [pp] [extra rlinf-ext convert hf2mg options]

  hf_dir   the HF model folder (e.g. Qwen2.5-3B: config.json + safetensors)
  mg_out   output Megatron checkpoint folder (must not exist; add --force to replace it);
           gets latest_checkpointed_iteration.txt + release/mp_rank_XX[_YYY]/model_optim_rng.pt
  tp, pp   tensor / pipeline parallel sizes (default 1 and 1)

Extra options are passed on, e.g. --dtype bf16, --layernorm-names local, --force.
Environment: PYTHON (interpreter with rlinf_ext installed; default: python3).
USAGE
}

SCRIPT_DIR=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
. "$SCRIPT_DIR/convert_common.sh"
need_args 2 "$@"

HF_DIR=$1
MG_OUT=$2
shift 2
TP=1
PP=1
if [ "$#" -gt 0 ]; then case "$1" in -*) ;; *) TP=$1; shift ;; esac; fi
if [ "$#" -gt 0 ]; then case "$1" in -*) ;; *) PP=$1; shift ;; esac; fi

run_convert hf2mg --hf "$HF_DIR" --out "$MG_OUT" --tp "$TP" --pp "$PP" "$@"
