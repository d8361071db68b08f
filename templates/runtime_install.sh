#!/bin/bash
# clusterctl: install the node runtime from a relayed pack, verified, at /opt/clusterctl-runtime/<id>.
#   $1 id  $2 incoming folder (holds runtime.tar.zst and runtime.json, already checked against the
#   sender's sha256 by the relay)
# The runtime counts as installed only when its marker exists, and the marker is written last, after the
# unpacked tree matched runtime.json (file count and bytes) and its Python imported horovod and boto3 (on GPU
# runtimes: horovod.tensorflow with NCCL built in, here as on the builder).
# Prints one line: "runtime=present" (nothing to do) or "runtime=installed".
set -euo pipefail
ID=$1 IN=$2
ROOT=/opt/clusterctl-runtime
PREFIX=$ROOT/$ID
MARKER=$PREFIX/.clusterctl-runtime.json
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo -n"

if [ -f "$MARKER" ]; then
  echo "runtime=present"
  rm -rf -- "$IN"
  exit 0
fi
want() { sed -n "s/.*\"$1\": *\([0-9][0-9]*\).*/\1/p" "$IN/runtime.json"; }
files=$(want files) bytes=$(want bytes)
[ -n "$files" ] && [ -n "$bytes" ] || { echo "runtime: $IN/runtime.json is incomplete" >&2; exit 1; }
grep -q "\"id\": *\"$ID\"" "$IN/runtime.json" || { echo "runtime: $IN/runtime.json is not runtime $ID" >&2; exit 1; }

$SUDO mkdir -p "$ROOT"
$SUDO chown "$(id -u):$(id -g)" "$ROOT"
rm -rf -- "$ROOT/.$ID".partial.* "$PREFIX"  # an interrupted earlier attempt (never marked complete)
work=$(mktemp -d "$ROOT/.$ID.partial.XXXXXX")
trap 'rm -rf -- "$work"' EXIT
zstd -q -d -c "$IN/runtime.tar.zst" | tar -x -C "$work" -f -
tree=$work/${PREFIX#/}
[ -d "$tree" ] || { echo "runtime: the pack does not hold $PREFIX" >&2; exit 1; }
got_files=$(find "$tree" -type f | wc -l)
got_bytes=$(find "$tree" -type f -printf '%s\n' | awk '{s+=$1} END {printf "%d", s}')
if [ "$got_files" != "$files" ] || [ "$got_bytes" != "$bytes" ]; then
  echo "runtime: unpacked $got_files files / $got_bytes bytes, expected $files / $bytes" >&2
  exit 1
fi
mv "$tree" "$PREFIX"
"$PREFIX/bin/python" -c "import horovod, boto3" \
  || { rm -rf -- "$PREFIX"; echo "runtime: its Python does not start on this node" >&2; exit 1; }
if grep -q '"gpu": *true' "$IN/runtime.json"; then
  "$PREFIX/bin/python" -c "import sys, horovod.tensorflow as hvd; sys.exit(0 if hvd.nccl_built() else 1)" \
    || { rm -rf -- "$PREFIX"; echo "runtime: horovod.tensorflow does not import with NCCL built in on this node" >&2; exit 1; }
fi
cp "$IN/runtime.json" "$MARKER.partial"
sync -f "$MARKER.partial" 2>/dev/null || true
mv "$MARKER.partial" "$MARKER"
rm -rf -- "$IN"
echo "runtime=installed"
