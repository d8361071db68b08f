#!/bin/sh
# clusterctl doctor: one node's facts as key=value lines. Read-only; every probe bounded in time.
# $1: the Python every rank runs; $2: space-separated addresses of every other node (for the ssh mesh).
PY=$1
PEERS=$2
echo "hostname=$(hostname)"
echo "time=$(date +%s.%N)"
if [ -x "$PY" ] || command -v "$PY" >/dev/null 2>&1; then
  "$PY" - <<'PYEOF' 2>/dev/null || echo "python=broken"
import importlib.metadata as md, platform
def v(*names):
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            pass
    return "none"
print("python=" + platform.python_version())
print("tensorflow=" + v("tensorflow", "tensorflow-cpu", "tensorflow-gpu"))
print("horovod=" + v("horovod"))
PYEOF
else
  echo "python=missing"
fi
# the node runtime this Python belongs to (its marker, written last by the runtime's installer)
case "$PY" in
  /*) M="$(dirname "$(dirname "$PY")")/.clusterctl-runtime.json"
      if [ -f "$M" ]; then echo "runtime=$(sed -n 's/.*"id": *"\([0-9a-f]*\)".*/\1/p' "$M")"; else echo "runtime=none"; fi ;;
  *) echo "runtime=none" ;;
esac
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpus=$(timeout 20 nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)"
  echo "cuda_driver=$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)"
  echo "gpu_procs=$(timeout 20 nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c .)"
  nccl=$(ls /usr/lib/x86_64-linux-gnu/libnccl.so.* /usr/local/cuda/lib64/libnccl.so.* 2>/dev/null | head -n1)
  echo "nccl=${nccl##*.so.}"
else
  echo "gpus=n/a"; echo "cuda_driver=n/a"; echo "gpu_procs=n/a"; echo "nccl=n/a"
fi
df -Pk "$HOME" | awk 'NR==2 {printf "disk_free_pct=%.1f\ndisk_free_gb=%.1f\n", 100*$4/($3+$4), $4/1048576}'
awk '/^MemAvailable:/ {printf "mem_free_gb=%.1f\n", $2/1048576}' /proc/meminfo
# stale training processes: python ranks, launchers, MPI daemons (the bracket keeps pgrep off itself)
echo "stale=$(pgrep -f '[h]orovodrun|[m]pirun|[o]rted|[p]ython.*(train|bench|horovod)' | grep -vc "^$$\$")"
if [ -d /sys/class/infiniband ]; then
  echo "efa=$(ls /sys/class/infiniband 2>/dev/null | grep -c efa)"
else
  echo "efa=n/a"
fi
bad=""
for h in $PEERS; do
  (ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=5 "$h" true </dev/null >/dev/null 2>&1 \
     || echo "$h") &
done > "${TMPDIR:-/tmp}/.clusterctl-mesh.$$"
wait
bad=$(tr '\n' ' ' < "${TMPDIR:-/tmp}/.clusterctl-mesh.$$")
rm -f "${TMPDIR:-/tmp}/.clusterctl-mesh.$$"
echo "mesh_fail=${bad% }"
