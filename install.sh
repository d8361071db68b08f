#!/usr/bin/env bash
# clusterctl's one installer, for a fresh Debian 12 machine, as root.
#   ./install.sh demo   install everything, then run the main job on the built-in local cluster
#   ./install.sh test   install everything the tests need, then ruff (lint, format), mypy and the whole test suite
#   ./install.sh deps   install only
#   ./install.sh links  only link the venv's clusterctl and horovodrun into CLUSTERCTL_BIN_DIR (what every mode does)
# Installs into a venv made from Debian's python3.11 (readable by every node's login, unlike a
# python under /root), links clusterctl and horovodrun into /usr/local/bin where no other program of that
# name is, and builds Horovod against TensorFlow 2.15.1.
set -euo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
VENV=${CLUSTERCTL_VENV:-/opt/clusterctl/venv}
BIN=${CLUSTERCTL_BIN_DIR:-/usr/local/bin}
MODE=${1:-deps}

# ours NAME: the program NAME found in BIN or on PATH is this installer's own (a link into a venv whose
# clusterctl script is clusterctl's, this one or an older one) or a link to nothing; else another program of
# that name (the Kubernetes Cluster API ships a `clusterctl` too), which stays where and what it is.
ours() {
  local found dir
  for found in "$BIN/$1" $(type -ap "$1" 2>/dev/null); do
    [ -e "$found" ] || [ -L "$found" ] || continue
    [ -L "$found" ] && [ ! -e "$found" ] && continue  # a link to nothing: no program
    [ "$(readlink -f "$found")" = "$(readlink -f "$VENV/bin/$1")" ] && continue  # this venv's own
    [ -L "$found" ] || return 1
    dir=$(dirname "$(readlink -f "$found")")
    grep -qs '^from clusterctl\.' "$dir/clusterctl" || return 1
  done
}

link_programs() {
  local name target
  for name in clusterctl horovodrun; do
    target="$VENV/bin/$name"
    [ -x "$target" ] || continue
    if ours "$name"; then
      mkdir -p "$BIN"
      ln -sfn "$target" "$BIN/$name"
    else
      echo "== $name: not linked into $BIN: another program of that name is there or on PATH" \
           "($(type -ap "$name" 2>/dev/null | head -1 || true)); this one is $target (add $VENV/bin to PATH)"
    fi
  done
}

[ "$(id -u)" = 0 ] || { echo "Error: install.sh needs root (apt packages, network namespaces): run it with sudo" >&2; exit 3; }
case "$MODE" in demo|test|deps|links) ;; *) echo "Error: unknown mode '$MODE': use demo, test, deps or links" >&2; exit 2;; esac
[ "$MODE" != links ] || { link_programs; exit 0; }

PKGS="openssh-server openssh-client rsync tmux iproute2 iptables procps psmisc util-linux ca-certificates
      python3.11 python3.11-venv python3.11-dev build-essential cmake git pdsh clustershell zstd curl"
missing=$(dpkg-query -W -f='${Package} ${Status}\n' $PKGS 2>/dev/null | awk '$NF!="installed"{print $1}'; \
          for p in $PKGS; do dpkg-query -W "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$(echo "$missing" | tr -d '[:space:]')" ]; then
  echo "== apt: installing $(echo $missing | tr '\n' ' ')"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(echo "$missing" | sort -u) >/dev/null
fi
mkdir -p /run/sshd

if [ ! -x "$VENV/bin/python" ]; then
  echo "== venv: $VENV"
  /usr/bin/python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip wheel setuptools
fi
PIP="$VENV/bin/pip"
echo "== pip: clusterctl[train,test]"
"$PIP" install -q --disable-pip-version-check -e "$HERE[train,test]"

# The wheelhouse: every wheel the node runtime needs (clusterctl/runtime/spec.py), with DALI (`up --runtime dali`),
# Horovod and DALI's TensorFlow plugin built here once against this exact TensorFlow. Local clusters' runtimes and
# this venv's Horovod and plugin install from it, offline.
WHEELS=${CLUSTERCTL_WHEELHOUSE:-/var/cache/clusterctl/wheelhouse}
REQS=$("$VENV/bin/python" -m clusterctl.runtime requirements --dali)
DALI_TF=$(echo "$REQS" | grep '^nvidia-dali-tf-plugin')
stamp="$WHEELS/.complete-v2-$(printf '%s' "$REQS" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "== wheelhouse: $WHEELS"
  mkdir -p "$WHEELS"
  if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
    echo "== horovod: building its wheel against TensorFlow with gloo (about 2-5 minutes, once per machine)"
    # No build isolation and no wheel cache: the wheel must be built against this venv's TF (FACTS.md).
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITHOUT_MPI=1 "$PIP" wheel -q --disable-pip-version-check --no-deps --no-cache-dir \
      --no-build-isolation -w "$WHEELS" "$(echo "$REQS" | grep '^horovod==')"
  fi
  # Everything else, dependencies included (Horovod's come from its wheel just built, found in the folder).
  # shellcheck disable=SC2086
  "$PIP" download -q --disable-pip-version-check --find-links "$WHEELS" -d "$WHEELS" $(echo "$REQS" | grep -v '^nvidia-dali-tf-plugin')
  if ! ls "$WHEELS"/nvidia_dali_tf_plugin_cuda120-*.whl >/dev/null 2>&1; then
    echo "== DALI's TensorFlow plugin: building its wheel against TensorFlow (about a minute, once per machine)"
    # It includes cuda_runtime_api.h and crt/host_defines.h: the include folders of the two CUDA wheels just
    # downloaded, merged (no CUDA toolkit on this machine). It loads DALI's CPU backend here.
    cuda=$(mktemp -d)
    for w in "$WHEELS"/nvidia_cuda_runtime_cu12-*.whl "$WHEELS"/nvidia_cuda_nvcc_cu12-*.whl; do
      "$VENV/bin/python" -m zipfile -e "$w" "$cuda/wheel"
    done
    mkdir -p "$cuda/include"
    cp -r "$cuda"/wheel/nvidia/cuda_runtime/include/. "$cuda"/wheel/nvidia/cuda_nvcc/include/. "$cuda/include/"
    CUDA_HOME="$cuda" "$PIP" wheel -q --disable-pip-version-check --no-deps --no-cache-dir --no-build-isolation \
      -w "$WHEELS" "$DALI_TF"
    rm -rf "$cuda"
  fi
  touch "$stamp"
fi
if ! "$VENV/bin/python" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  "$PIP" install -q --disable-pip-version-check --no-index --find-links "$WHEELS" "$(echo "$REQS" | grep '^horovod==')"
fi
if ! "$VENV/bin/python" -c "import nvidia.dali.plugin.tf" >/dev/null 2>&1; then
  "$PIP" install -q --disable-pip-version-check --no-index --find-links "$WHEELS" "$DALI_TF"
fi
link_programs
echo "== installed: $("$VENV/bin/clusterctl" --version 2>/dev/null || echo clusterctl)"
export PATH="$VENV/bin:$PATH"  # the demo's clusterctl is this one, linked or not

case "$MODE" in
  demo)
    work=$(mktemp -d /var/tmp/clusterctl-demo.XXXXXX)
    cd "$work"
    trap 'clusterctl down demo --yes >/dev/null 2>&1 || true' EXIT
    clusterctl up --provider local --name demo --nodes 2 --slots 2 --yes
    clusterctl run --cluster demo --group 'uname -sr; nproc'
    clusterctl doctor --cluster demo
    clusterctl bench --synthetic --model tiny --cluster demo
    clusterctl down demo --yes
    trap - EXIT
    ;;
  test)
    # Lint, format and types before the tests (rules in pyproject.toml's [tool.ruff] and [tool.mypy]): a
    # finding fails the run like a failed test does. `ruff format .` fixes a format finding.
    echo "== ruff check"
    "$VENV/bin/ruff" check --no-cache .
    echo "== ruff format --check"
    "$VENV/bin/ruff" format --check --no-cache .
    echo "== mypy"
    "$VENV/bin/mypy" --cache-dir=/dev/null
    # Two modules at a time, each whole on one worker (its nodes and module fixtures shared by its tests): the
    # suite mostly waits on nodes, so two run in about half the time on two cores.
    exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder tests
    ;;
esac
