#!/usr/bin/env bash
# Train MMSearch-R1 (GRPO of a Qwen2.5-VL model that searches images and text) as one experiment YAML says.
#   bash examples/mmsearch/run_main_mmsearch_single.sh [CONFIG_NAME|CONFIG.yaml] [key=value ...]
# CONFIG_NAME is a file under examples/mmsearch/config/ without .yaml (default: tiny-mm-cpu, the tiny
# multimodal world on a CPU; its assets and warm start are generated on first use). qwen2.5-vl-7b-1node is the
# reference run on 8xH100 (FSDP2 actor, vLLM rollout; -collocated shares the GPUs: written, NOT GPU-verified).
# Runs from any directory.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../searchr1" && pwd)/launch_common.sh"
rlinf_ext_run_launcher "${BASH_SOURCE[0]}" tiny-mm-cpu train "$@"
