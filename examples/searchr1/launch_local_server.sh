#!/usr/bin/env bash
# Serve /retrieve, /access and /health over a built index (thin wrapper around `rlinf-ext serve-retriever`).
#
#   examples/searchr1/launch_local_server.sh [INDEX_DIR] [CORPUS] [--port N] [other serve-retriever flags...]
#
# Paths come from the arguments or the environment (INDEX_DIR, CORPUS, PAGES); PORT (default 8000; 0 picks
# a free port), HOST (default 127.0.0.1), TOPK (default 3), ADDRESS_DIR (writes Host<host>_IP<port>.txt there).
# Flags given on the command line (e.g. --port 8123) win over the environment. Works from any directory.
set -euo pipefail

# Leading arguments that are not flags are the positional paths; the rest goes to serve-retriever.
INDEX_DIR="${INDEX_DIR:-}"
CORPUS="${CORPUS:-}"
if [[ $# -gt 0 && "$1" != -* ]]; then INDEX_DIR="$1"; shift; fi
if [[ $# -gt 0 && "$1" != -* ]]; then CORPUS="$1"; shift; fi
if [[ -z "$INDEX_DIR" || -z "$CORPUS" ]]; then
  echo "usage: $0 INDEX_DIR CORPUS [--port N] [serve-retriever flags]   (or set INDEX_DIR and CORPUS)" >&2
  exit 2
fi
args=(--index "$INDEX_DIR" --corpus "$CORPUS" --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}"
      --topk "${TOPK:-3}")
if [[ -n "${PAGES:-}" ]]; then args+=(--pages "$PAGES"); fi
if [[ -n "${ADDRESS_DIR:-}" ]]; then args+=(--save-address-to "$ADDRESS_DIR"); fi
# argparse keeps the last occurrence of a flag, so "$@" (e.g. --port 8123) overrides the defaults above.
exec "${PYTHON:-python}" -m rlinf_ext.cli serve-retriever "${args[@]}" "$@"
