#!/usr/bin/env bash
# vLLM 0.26 (trimmed) to the lent GPU in two device calls, then scripts/gpu_smoke.py's vLLM stage (S8) there.
# docs/environment.md ("vLLM on the lent GPU") says why 0.26 (the newest vLLM built for the device's torch 2.11)
# and gives the two calls; `build` trims the wheel to what a dense text model needs on Hopper (~104 MB).
#
#   bash scripts/device_vllm_smoke.sh build [DIR]  here, with network: DIR/.whl1 (the first 55 MiB of the trimmed
#                                                  wheel) and DIR/.whl2 (the rest, the trimmed wheel's size and
#                                                  sha256 computed now, 30 small wheels); DIR = the checkout root
#   bash scripts/device_vllm_smoke.sh part1        device call 1 (carry .whl1): the first part to /tmp, which the
#                                                  warm machine keeps until it goes back (30 s idle)
#   bash scripts/device_vllm_smoke.sh part2        device call 2 (carry .whl2), right after call 1: join, check the
#                                                  size and sha256, pip install --target, run S8; results in $OUT
#   bash scripts/device_vllm_smoke.sh rerun        a later call on the same warm machine (no carry): S8 again on
#                                                  the installed vLLM (after a fix of the stage or of rlinf_ext)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VLLM_WHEEL=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
PUBLISHED_SHA256=adb1e4c9b46d0dfdb094121ae5aad670a42412dd813ed4e5db069ed6a15006de  # PyPI's vllm 0.26.0
# the published wheel less the members below, RECORD rewritten: 104,483,166 B in offline-gpu-vllm.md, 104,484,507 B
# here (the rewritten RECORD's deflate output varies with the zlib build by ~1 KB), so `build` checks it within
# TRIMMED_SLACK and records the exact size and sha256 it made; part2 checks those
TRIMMED_SIZE=104483166
TRIMMED_SLACK=65536
TRIMMED_SHA256_FILE=vllm-0.26.0-trimmed.sha256  # in .whl2: "<sha256>  <wheel>", computed by `build`
TRIMMED_SIZE_FILE=vllm-0.26.0-trimmed.size      # in .whl2: the trimmed wheel's bytes, computed by `build`
PART_BYTES=55M  # the two parts' carries come out near 61.7 and 61.8 MB with a 4 MB checkout
# members a dense text model on Hopper never loads: FA2 (Hopper runs FA3), the Rust frontend, Blackwell and FP8
# kernels, MLA and MoE kernels, the OpenAI server's static files
DROP='^vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so$|^vllm/vllm-rs$|^vllm/third_party/(fmha_sm100|deep_gemm)/|^vllm/(_flashmla_C|_flashmla_extension_C|_qutlass_C|_rust_tool_parser|_moe_C_stable_libtorch)\.abi3\.so$|^vllm/entrypoints/serve/instrumentator/static/'
# what vLLM 0.26's path imports and the GPU host lacks (offline-gpu-vllm.md section 2; the last four shadow older
# host copies), and what rlinf_ext's vLLM modules import beyond the host (omegaconf, antlr4)
SMALL_WHEELS=(annotated-types==0.8.0 astor==0.8.1 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 depyf==0.20.0
  dill==0.4.1 fastapi==0.136.3 httpcore2==2.16.2 httpx2==2.16.2 jiter==0.19.0 msgspec==0.22.0 openai==3.57.0
  openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5
  pyzmq==27.3.0 setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0 truststore==0.10.5 typing-inspection==0.4.5
  anyio==4.16.0 h11==0.16.0 idna==3.20 typing-extensions==4.16.0 omegaconf==2.3.1)
SDIST_WHEELS=(antlr4-python3-runtime==4.9.3)  # sdist only on PyPI: built into a pure-Python wheel here
CALL_LIMIT=67108864  # bytes a device call may carry: the checkout's files and one of the two folders
CALL_MARGIN=4194304  # kept free in each call, so the checkout can grow by this much before a carry stops fitting
DEVICE_PYTHON=3.12   # the small wheels are cp312 builds (pip download --python-version 3.12)
DEVICE_TORCH=2.11    # vLLM 0.26.0's kernels are built against torch 2.11
PARTS=/tmp/vllm026_parts
SITE=/tmp/vllm026_site

die() { echo "device_vllm_smoke: $*" >&2; exit 1; }

# the device's Python and torch, checked before anything is copied or installed: a mismatch would otherwise spend the
# lent device's minutes on an install that cannot import
check_device() {
  local found py torch
  found=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2]); import torch; print(torch.__version__)' 2>&1) \
    || die "this machine's python3 cannot import torch ($found): the carried vLLM 0.26.0 needs Python $DEVICE_PYTHON with torch $DEVICE_TORCH; nothing was installed"
  py=$(sed -n 1p <<< "$found"); torch=$(sed -n 2p <<< "$found")
  if [ "$py" != "$DEVICE_PYTHON" ] || [[ "$torch" != "$DEVICE_TORCH".* ]]; then
    die "this machine has Python $py and torch $torch; the carried wheels need Python $DEVICE_PYTHON and torch $DEVICE_TORCH.x: nothing was installed (another device needs another vLLM build: docs/environment.md, 'vLLM on the lent GPU')"
  fi
  echo "device: Python $py, torch $torch"
}

build() {
  local dest=${1:-$REPO} w v
  dest=$(cd "$dest" && pwd)
  if [ "$dest" = "$REPO" ]; then  # never tracked, never sent unless carried
    local exclude; exclude=$(git -C "$REPO" rev-parse --git-path info/exclude)
    for d in /.whl1/ /.whl2/; do grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
  fi
  rm -rf "$dest/.whl1" "$dest/.whl2"; mkdir -p "$dest/.whl1" "$dest/.whl2"
  BUILD_TMP=$(mktemp -d); trap 'rm -rf "$BUILD_TMP"' EXIT; w=$BUILD_TMP
  local pf=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
    --platform manylinux1_x86_64)
  python3 -m pip download -q "${pf[@]}" -d "$w" vllm==0.26.0
  v=$w/$VLLM_WHEEL
  echo "$PUBLISHED_SHA256  $v" | sha256sum -c - || die "the downloaded vllm 0.26.0 wheel is not PyPI's"
  unzip -Z1 "$v" | grep -E "$DROP" > "$w/drop.txt"
  zip -q -d "$v" -@ < "$w/drop.txt"
  mkdir -p "$w/rec/vllm-0.26.0.dist-info"
  unzip -p "$v" vllm-0.26.0.dist-info/RECORD | DROP_LIST="$w/drop.txt" OUT_RECORD="$w/rec/vllm-0.26.0.dist-info/RECORD" \
    python3 -c '
import csv, os, sys
drop = set(open(os.environ["DROP_LIST"]).read().split("\n"))
rows = [r for r in csv.reader(sys.stdin) if r and r[0] not in drop]
csv.writer(open(os.environ["OUT_RECORD"], "w", newline=""), lineterminator="\n").writerows(rows)'
  (cd "$w/rec" && zip -q "$v" vllm-0.26.0.dist-info/RECORD)
  unzip -tq "$v" > /dev/null || die "the trimmed wheel does not test clean"
  local size; size=$(stat -c %s "$v")
  [ $((size > TRIMMED_SIZE ? size - TRIMMED_SIZE : TRIMMED_SIZE - size)) -le "$TRIMMED_SLACK" ] \
    || die "trimmed wheel is $size B, expected $TRIMMED_SIZE +- $TRIMMED_SLACK: the dropped members differ"
  echo "$size" > "$dest/.whl2/$TRIMMED_SIZE_FILE"
  (cd "$w" && sha256sum "$VLLM_WHEEL") > "$dest/.whl2/$TRIMMED_SHA256_FILE"
  (cd "$w" && split -b "$PART_BYTES" "$VLLM_WHEEL" vllm.part.)
  mv "$w/vllm.part.aa" "$dest/.whl1/"; mv "$w/vllm.part.ab" "$dest/.whl2/"
  [ ! -e "$w/vllm.part.ac" ] || die "the trimmed wheel needs more than two parts"
  python3 -m pip download -q "${pf[@]}" -d "$dest/.whl2" "${SMALL_WHEELS[@]}"
  python3 -m pip wheel -q --no-deps -w "$w/sdist" "${SDIST_WHEELS[@]}"
  mv "$w"/sdist/*.whl "$dest/.whl2/"
  local checkout; checkout=$(git -C "$REPO" ls-files -z | (cd "$REPO" && xargs -0 stat -c %s 2>/dev/null) | awk '{s+=$1} END {print s}')
  for d in .whl1 .whl2; do
    local n; n=$(find "$dest/$d" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
    [ $((n + checkout + CALL_MARGIN)) -le "$CALL_LIMIT" ] \
      || die "$d ($n B) and the checkout ($checkout B) leave less than $CALL_MARGIN B of a call's $CALL_LIMIT B: lower PART_BYTES"
    echo "$d: $n B in $(ls "$dest/$d" | wc -l) files (+ checkout $checkout B = $((n + checkout)) of $CALL_LIMIT B)"
  done
  echo "trimmed wheel: $size B, sha256 $(cut -d' ' -f1 "$dest/.whl2/$TRIMMED_SHA256_FILE")"
}

part1() {
  check_device
  [ -f .whl1/vllm.part.aa ] || die "no .whl1/vllm.part.aa: build it here (bash scripts/device_vllm_smoke.sh build) and carry .whl1"
  mkdir -p "$PARTS"; cp .whl1/vllm.part.aa "$PARTS/"
  ls -l "$PARTS"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader || true
  python3 -c 'import transformers; print("transformers", transformers.__version__)'
}

part2() {
  check_device
  [ -f .whl2/vllm.part.ab ] && [ -f ".whl2/$TRIMMED_SHA256_FILE" ] && [ -f ".whl2/$TRIMMED_SIZE_FILE" ] \
    || die "no .whl2 (vllm.part.ab, $TRIMMED_SHA256_FILE, $TRIMMED_SIZE_FILE): build it here and carry .whl2"
  local first=$PARTS/vllm.part.aa
  [ -f "$first" ] || first=.whl1/vllm.part.aa
  [ -f "$first" ] || die "the first part is not on this machine: call 1 (part1) ran on one that has gone back since (it stays 30 s after a call); run part1 and part2 again, back to back"
  mkdir -p "$PARTS"
  cat "$first" .whl2/vllm.part.ab > "$PARTS/$VLLM_WHEEL"
  [ "$(stat -c %s "$PARTS/$VLLM_WHEEL")" = "$(cat .whl2/$TRIMMED_SIZE_FILE)" ] \
    || die "joined wheel is $(stat -c %s "$PARTS/$VLLM_WHEEL") B, built as $(cat .whl2/$TRIMMED_SIZE_FILE) B"
  (cd "$PARTS" && sha256sum -c "$REPO/.whl2/$TRIMMED_SHA256_FILE") || die "the joined wheel's sha256 differs from the one recorded at build"
  local t=$SECONDS
  rm -rf "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$PARTS/$VLLM_WHEEL" .whl2/*.whl
  rm -f "$PARTS/$VLLM_WHEEL"
  echo "installed in $((SECONDS - t)) s"
  run_stage
}

run_stage() {
  [ -d "$SITE/vllm" ] || die "vLLM is not installed on this machine ($SITE): run part1 and part2"
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
  mkdir -p "${OUT:?OUT is set by the device tool}"
  set +e
  # S8's own timeout (150 s) x 1.6: on a bare machine vLLM's ~800 modules compile to bytecode at the first import
  python3 scripts/gpu_smoke.py --out "$OUT" --work /tmp/smokework --stages S8 --budget-s 300 --timeout-scale 1.6 \
    2>&1 | tee "$OUT/s8.log"
  local rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}

case "${1:-}" in
  build) shift; build "$@" ;;
  part1) cd "$REPO"; part1 ;;
  part2) cd "$REPO"; part2 ;;
  rerun) cd "$REPO"; check_device; run_stage ;;
  *) die "usage: $0 build [DIR] | part1 | part2 | rerun" ;;
esac
