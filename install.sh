#!/usr/bin/env bash
# clusterctl's one installer, for a fresh Debian 12 machine, as root.
#   ./install.sh demo   install everything, then run the main job on the built-in local cluster
#   ./install.sh test   install everything the tests need, then run the whole test suite
#   ./install.sh deps   install only
# Installs into a venv made from Debian's python3.11 (readable by every node's login, unlike a
# python under /root), links /usr/local/bin/clusterctl, and builds Horovod against TensorFlow 2.15.1.
set -euo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
VENV=${CLUSTERCTL_VENV:-/opt/clusterctl/venv}
MODE=${1:-deps}

[ "$(id -u)" = 0 ] || { echo "Error: install.sh needs root (apt packages, network namespaces): run it with sudo" >&2; exit 3; }
case "$MODE" in demo|test|deps) ;; *) echo "Error: unknown mode '$MODE': use demo, test or deps" >&2; exit 2;; esac

PKGS="openssh-server openssh-client rsync tmux iproute2 iptables procps psmisc util-linux ca-certificates
      python3.11 python3.11-venv python3.11-dev build-essential cmake git pdsh clustershell"
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

# Horovod must be built against this exact TensorFlow: no build isolation, no wheel cache.
if ! "$VENV/bin/python" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  echo "== horovod 0.28.1: building against TensorFlow 2.15.1 with gloo (about 2-5 minutes)"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITHOUT_MPI=1 "$PIP" install -q --no-cache-dir --no-build-isolation horovod==0.28.1
fi
ln -sf "$VENV/bin/clusterctl" /usr/local/bin/clusterctl
ln -sf "$VENV/bin/horovodrun" /usr/local/bin/horovodrun 2>/dev/null || true
echo "== installed: $(clusterctl --version 2>/dev/null || echo clusterctl)"

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
    exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests
    ;;
esac
