#!/bin/sh
# Convert a Megatron actor checkpoint (any TP/PP) to a Hugging Face model folder.
# POSIX sh: runs with bash or sh, from any directory. Wraps `rlinf-ext convert mg2hf`.
set -eu

usage() {
    cat <<USAGE
usage: mg2hf_3b.sh <mg_actor_dir> <hf_out> <orig_hf> [extra rlinf-ext convert mg2hf options]

  mg_actor_dir  Megatron checkpoint: RLinf's .../checkpoints/global_step_N/actor, or its
                iter_XXXXXXX folder, or any folder with latest_checkpointed_iteration.txt
  hf_out        output folder for the HF model (must not exist; add --force to replace it)
  orig_hf       the original HF model (e.g. Qwen2.5-3B): config, generation config and
                tokenizer files are copied from it, never its weights

Extra options are passed on, e.g. --dtype bf16, --verify, --force.
Environment: PYTHON (interpreter with rlinf_ext installed; default: python3).
USAGE
}

SCRIPT_DIR=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
. "$SCRIPT_DIR/convert_common.sh"
need_args 3 "$@"

MG_DIR=$1
HF_OUT=$2
ORIG_HF=$3
shift 3

run_convert mg2hf --mg "$MG_DIR" --out "$HF_OUT" --hf-template "$ORIG_HF" "$@"
