#!/bin/bash
# clusterctl: build the node runtime once, at its final path, and pack it for the relay.
#   $1 id  $2 base python  $3 out dir  $4 requirements (space-separated)  $5 horovod requirement
#   $6 Horovod build environment (space-separated K=V)  $7 find-links (wheel folder or URL, may be empty)
#   $8 1: no index (offline, the find-links only)  $9 runtime.json content (the build's facts)
#   $10 GPU nodes: the NCCL requirement (nvidia-nccl-cu12==X, over TensorFlow's older pin); empty elsewhere
#   $11 DALI's TensorFlow plugin requirement (empty: no DALI)
# Writes OUT/runtime.tar.zst and OUT/runtime.json (last). A failed or interrupted build leaves neither.
set -euo pipefail
ID=$1 PY=$2 OUT=$3 REQS=$4 HVD=$5 HVD_ENV=$6 LINKS=$7 NOINDEX=$8 INFO=$9 NCCL=${10:-} DALI_TF=${11:-}
ROOT=/opt/clusterctl-runtime
PREFIX=$ROOT/$ID
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo -n"

# What the venv and the Horovod build need from the image (Ubuntu images may lack them; never on local nodes,
# whose builder is the operator's machine with install.sh's packages).
need=""
"$PY" -c "import ensurepip" 2>/dev/null || need="$need python3-venv"
[ -e "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || need="$need python3-dev"
command -v cmake >/dev/null || need="$need cmake"
command -v g++ >/dev/null || need="$need g++"
command -v zstd >/dev/null || need="$need zstd"
if [ -n "$need" ]; then
  echo "runtime: installing$need" >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

$SUDO mkdir -p "$ROOT"
$SUDO chown "$(id -u):$(id -g)" "$ROOT"
# PREFIX may be a mount point (a builder's private tmpfs): empty it, never remove it.
if [ -d "$PREFIX" ]; then find "$PREFIX" -mindepth 1 -delete; fi
rm -f "$OUT/runtime.tar.zst.partial"
mkdir -p "$OUT"
rm -f "$OUT/runtime.json" "$OUT/runtime.tar.zst"

PIPARGS=(--no-cache-dir --disable-pip-version-check --progress-bar off)
[ -n "$LINKS" ] && PIPARGS+=(--find-links "$LINKS")
case "$LINKS" in  # a plain-http mirror the user named explicitly (pip ignores it otherwise)
  http://*) h=${LINKS#http://}; h=${h%%/*}; PIPARGS+=(--trusted-host "${h%%:*}") ;;
esac
[ "$NOINDEX" = 1 ] && PIPARGS+=(--no-index)
# This machine's pip settings are not the runtime's: only the arguments above decide where wheels come from.
for v in $(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
export PIP_CONFIG_FILE=/dev/null

echo "runtime: venv at $PREFIX on $("$PY" --version)" >&2
"$PY" -m venv "$PREFIX"
echo "runtime: installing $REQS" >&2
# shellcheck disable=SC2086  # the requirements are words on purpose
"$PREFIX/bin/pip" install -q "${PIPARGS[@]}" $REQS
if [ -n "$NCCL" ]; then
  # TensorFlow's and-cuda extra pins an NCCL older than the EFA plugin's floor; Horovod's collectives use this one
  # (pip reports TensorFlow's pin as unmet: TensorFlow's own collectives are not used).
  echo "runtime: installing $NCCL over TensorFlow's NCCL" >&2
  "$PREFIX/bin/pip" install -q "${PIPARGS[@]}" --no-deps "$NCCL"
fi
# On GPU nodes (HOROVOD_CUDA_HOME set): that toolkit's nvcc first on PATH (Horovod's build_utils asks `nvcc` on
# PATH before $HOROVOD_CUDA_HOME/bin/nvcc for the architectures it can compile), and the NCCL of the
# nvidia-nccl-cu12 wheel just installed, which ships libnccl.so.2 only: CMake's find_library looks for libnccl.so.
hvd_var() { for kv in $HVD_ENV; do case $kv in "$1="*) echo "${kv#*=}" ;; esac; done; }
CUDA_HOME_=$(hvd_var HOROVOD_CUDA_HOME)
if [ -n "$CUDA_HOME_" ]; then
  [ -x "$CUDA_HOME_/bin/nvcc" ] || { echo "runtime: no nvcc in $CUDA_HOME_/bin" >&2; exit 1; }
  export PATH="$CUDA_HOME_/bin:$PATH"
fi
NCCL_HOME_=$(hvd_var HOROVOD_NCCL_HOME)
if [ -n "$NCCL_HOME_" ]; then
  [ -f "$NCCL_HOME_/include/nccl.h" ] && [ -f "$NCCL_HOME_/lib/libnccl.so.2" ] \
    || { echo "runtime: the NCCL wheel ($NCCL) is not at $NCCL_HOME_" >&2; exit 1; }
  ln -sfn libnccl.so.2 "$NCCL_HOME_/lib/libnccl.so"
fi
echo "runtime: $HVD against TensorFlow ($HVD_ENV)" >&2
# Built against the TF just installed: no build isolation, no wheel cache (FACTS: the cache ignores the TF).
# shellcheck disable=SC2086
env $HVD_ENV "$PREFIX/bin/pip" install -q "${PIPARGS[@]}" --no-build-isolation "$HVD"
"$PREFIX/bin/python" -c "import tensorflow, horovod.tensorflow, boto3" 2>/dev/null \
  || { echo "runtime: the built environment cannot import tensorflow, horovod.tensorflow and boto3" >&2; exit 1; }
if [ -n "$NCCL" ]; then
  # hvd.nccl_built() is the NCCL_VERSION_CODE Horovod compiled against (2.30.7 -> 23007): the wheel's, not TF's.
  "$PREFIX/bin/python" -c "import sys, horovod.tensorflow as hvd; a, b, c = map(int, sys.argv[1].split('==')[1].split('.')[:3]); sys.exit(0 if hvd.nccl_built() == a * 10000 + b * 100 + c else 1)" "$NCCL" \
    || { echo "runtime: Horovod was not built with $NCCL (hvd.nccl_built()): see the build output above" >&2; exit 1; }
fi

if [ -n "$DALI_TF" ]; then
  # DALI's plugin is compiled against the TF just installed (an sdist: no build isolation), and includes two CUDA
  # headers: the toolkit's on GPU nodes, else the include folders of the CUDA wheels in the venv (spec.py).
  DALI_CUDA=$CUDA_HOME_
  if [ -z "$DALI_CUDA" ]; then
    DALI_CUDA=$(mktemp -d)
    SITE=$("$PREFIX/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$DALI_CUDA/include"
    cp -r "$SITE/nvidia/cuda_runtime/include/." "$SITE/nvidia/cuda_nvcc/include/." "$DALI_CUDA/include/"
  fi
  echo "runtime: $DALI_TF against TensorFlow" >&2
  CUDA_HOME=$DALI_CUDA "$PREFIX/bin/pip" install -q "${PIPARGS[@]}" --no-build-isolation "$DALI_TF"
  [ "$DALI_CUDA" = "$CUDA_HOME_" ] || rm -rf "$DALI_CUDA"
  "$PREFIX/bin/python" -c "import nvidia.dali.plugin.tf" 2>/dev/null \
    || { echo "runtime: DALI's TensorFlow plugin does not load into the built environment" >&2; exit 1; }
fi

files=$(find "$PREFIX" -type f | wc -l)
bytes=$(find "$PREFIX" -type f -printf '%s\n' | awk '{s+=$1} END {printf "%d", s}')
echo "runtime: packing $files files, $((bytes / 1048576)) MiB" >&2
tar -C / -cf - "${PREFIX#/}" | zstd -q -1 -T0 -o "$OUT/runtime.tar.zst.partial"
mv "$OUT/runtime.tar.zst.partial" "$OUT/runtime.tar.zst"
"$PY" - "$INFO" "$files" "$bytes" "$OUT/runtime.json" <<'PYEOF'
import json, os, sys
info = json.loads(sys.argv[1])
info.update(files=int(sys.argv[2]), bytes=int(sys.argv[3]))
tmp = sys.argv[4] + ".partial"
with open(tmp, "w") as f:
    json.dump(info, f, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
os.replace(tmp, sys.argv[4])
PYEOF
echo "runtime: built $ID" >&2
