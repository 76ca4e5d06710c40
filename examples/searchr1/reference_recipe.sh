#!/usr/bin/env bash
# The reference Search-R1 run, step by step as examples/searchr1/README.md §2 lists it (the README's block is this
# script's marked lines: `--readme` prints them, and tests/e2e/test_reference_recipe.py fails when they differ).
#   bash examples/searchr1/reference_recipe.sh full WORK   the reference run on one node of 8xH100 (~90 GB downloaded)
#   bash examples/searchr1/reference_recipe.sh tiny WORK   the same steps on a CPU in minutes, over what the download
#                                                           fetches, generated offline at tiny size in the published
#                                                           formats (rlinf_ext/data/published_fixtures.py); CI runs it
#   bash examples/searchr1/reference_recipe.sh --readme    print the README's step block
# Needs `rlinf-ext` and `python` of the project's environment on PATH (activate $REPO/.venv). The retrieval server
# it starts is stopped when it exits.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

if [ "${1:-}" = "--readme" ]; then
  # the lines between the README markers, each region without its common indentation
  awk '/^ *# <<< README/ { inside = 0; for (i = 1; i <= n; i++) print substr(lines[i], cut + 1); n = 0; next }
       inside { lines[++n] = $0; if ($0 ~ /[^ ]/) { match($0, /^ */); if (cut < 0 || RLENGTH < cut) cut = RLENGTH } }
       /^ *# >>> README/ { inside = 1; cut = -1 }' "${BASH_SOURCE[0]}"
  exit 0
fi
if [ $# -ne 2 ] || { [ "$1" != full ] && [ "$1" != tiny ]; }; then
  sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" >&2
  exit 2
fi
SIZE=$1
mkdir -p "$2"
WORK="$(cd "$2" && pwd)"
trap 'jobs -p | xargs -r kill 2>/dev/null || true' EXIT   # the retrieval server of step 3

if [ "$SIZE" = full ]; then
  # >>> README
  CONFIG=qwen2.5-3b-tool-1node             # the experiment: examples/searchr1/config/$CONFIG.yaml and $CONFIG-eval.yaml
  MODEL=$WORK/models/Qwen2.5-3B-Instruct   # the policy model
  PORT=8000                                # the retrieval server's

  # 1) download: the e5 index, the wiki-18 corpus and the e5 encoder (Search-R1), the training data and the one merged
  #    test set (PeterJinGo/nq_hotpotqa_train), the policy model; every path below is where these land
  python $REPO/examples/searchr1/download.py --save_path $WORK --source searchr1 --what index,corpus,encoder,data
  hf download Qwen/Qwen2.5-3B-Instruct --local-dir $MODEL   # huggingface_hub's CLI (installed with the project)
  # <<< README
else
  CONFIG=tiny-recipe
  MODEL=$WORK/models/qwen2-tiny-sft-search
  PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # 1) what the download fetches, generated offline at tiny size, in the published formats and the same layout
  python -m rlinf_ext.data.published_fixtures --work "$WORK"
fi

# >>> README

# 2) adopt the downloaded e5_Flat.index as an index directory: memory-mapped, nothing re-encoded; refused with the
#    reason when the index, the corpus and the encoder do not agree
rlinf-ext adopt-index --faiss $WORK/e5_Flat.index --corpus $WORK/wiki-18.jsonl --retriever e5 \
    --model $WORK/models/e5-base-v2 --out $WORK/index/e5_flat

# 3) the retrieval server (keep it running; it batches concurrent requests), ready when /health answers.
#    --device cpu: training uses all 8 GPUs, and the encoder would otherwise sit beside actor rank 0 on GPU 0
rlinf-ext serve-retriever --index $WORK/index/e5_flat --corpus $WORK/wiki-18.jsonl --host 127.0.0.1 --port $PORT \
    --topk 3 --device cpu &
curl -sf --retry 600 --retry-delay 3 --retry-connrefused http://127.0.0.1:$PORT/health

# 4) data: Search-R1's train.parquet and its one merged test.parquet (seven data_sources) -> one prompt jsonl
#    each, chat template applied
rlinf-ext preprocess --config $REPO/examples/searchr1/prompt.yaml --tokenizer $MODEL \
    --input $WORK/data/nq_hotpotqa_train/train.parquet --output $WORK/searchr1_data/train.jsonl
rlinf-ext preprocess --config $REPO/examples/searchr1/prompt.yaml --tokenizer $MODEL \
    --input $WORK/data/nq_hotpotqa_train/test.parquet --output $WORK/searchr1_data/test.jsonl

# 5) train (the YAML reads the data directory and the server's address from these two variables)
export RLINF_EXT_SEARCHR1_DATA=$WORK/searchr1_data RLINF_EXT_RETRIEVER_ADDR=127.0.0.1:$PORT
rlinf-ext validate $CONFIG rollout.model.model_path=$MODEL --check-paths
bash $REPO/examples/searchr1/run_main_searchr1_single.sh $CONFIG rollout.model.model_path=$MODEL \
    runner.output_dir=$WORK/runs

# 6) convert the last checkpoint to Hugging Face (the launcher also converted it, into $RUN/hf_model/)
RUN=$WORK/runs/searchr1-grpo-$CONFIG
CKPT=$(ls -d $RUN/checkpoints/global_step_* | sort -V | tail -n 1)
rlinf-ext convert mg2hf --mg $CKPT/actor --out $WORK/models/searchr1-grpo-$CONFIG --hf-template $MODEL

# 7) evaluate it on the seven benchmarks, into the training run's output directory; then the EM table
bash $REPO/examples/searchr1/run_main_searchr1_single_eval.sh $CONFIG-eval \
    rollout.model.model_path=$WORK/models/searchr1-grpo-$CONFIG runner.output_dir=$WORK/runs
rlinf-ext eval-report $WORK/runs/searchr1-eval-$CONFIG --with-paper
# <<< README
