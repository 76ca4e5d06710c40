#!/usr/bin/env bash
# Build a retrieval index over a jsonl corpus (thin wrapper around `rlinf-ext build-index`).
#
#   examples/searchr1/build_index.sh [CORPUS] [OUT_DIR] [extra build-index flags...]
#
# Paths come from the arguments or the environment (CORPUS, INDEX_DIR); RETRIEVER (bm25|e5|bge, default
# bm25), MODEL (encoder directory or hub id, needed for e5/bge), FAISS_TYPE (default Flat), BATCH_SIZE (default 64).
# A downloaded index (Search-R1's e5_Flat.index) needs no build: `rlinf-ext adopt-index` serves it as it is.
# Works from any directory; relative paths are taken from the current directory.
#   CORPUS=/data/wiki-18.jsonl INDEX_DIR=/data/e5_flat RETRIEVER=e5 MODEL=/models/e5-base-v2 \
#     examples/searchr1/build_index.sh --gpus all
set -euo pipefail

CORPUS="${CORPUS:-}"
INDEX_DIR="${INDEX_DIR:-}"
if [[ $# -gt 0 && "$1" != -* ]]; then CORPUS="$1"; shift; fi
if [[ $# -gt 0 && "$1" != -* ]]; then INDEX_DIR="$1"; shift; fi
if [[ -z "$CORPUS" || -z "$INDEX_DIR" ]]; then
  echo "usage: $0 CORPUS OUT_DIR [build-index flags]   (or set CORPUS and INDEX_DIR)" >&2
  exit 2
fi
RETRIEVER="${RETRIEVER:-bm25}"
args=(--corpus "$CORPUS" --out "$INDEX_DIR" --retriever "$RETRIEVER"
      --faiss-type "${FAISS_TYPE:-Flat}" --batch-size "${BATCH_SIZE:-64}")
if [[ -n "${MODEL:-}" ]]; then
  args+=(--model "$MODEL")
fi
exec "${PYTHON:-python}" -m rlinf_ext.cli build-index "${args[@]}" "$@"
