#!/usr/bin/env bash
# Parameter-server image recipe (CPU only): Python 3.11 + tensorflow-cpu 2.21 + google-cloud-storage
# + scikit-learn, on Debian 12 (bookworm) on Compute Engine. The async chief (a CPU VM) uses it too.
#
# Run by `orchestrator image bake --role ps` on a builder VM, or by hand:  bash ps.sh
# Idempotent: a second run re-checks every step and changes nothing that is already in place.
#
# tensorflow-cpu is the same TensorFlow without the CUDA kernels (a smaller download); the parameter
# server and the chief only serve variables and coordinate, so they need no GPU. It must be the same
# version as the workers' TensorFlow: the gRPC protocol between tasks is not stable across versions.
set -euo pipefail

# ---------------------------------------------------------------- pinned versions
TF_VERSION="2.21.0"                 # tensorflow-cpu; keep equal to worker.sh's TF_VERSION
GCS_VERSION="3.17.1"                # google-cloud-storage
SKLEARN_VERSION="1.9.1"             # scikit-learn (the chief evaluates on the bundled digits data)
VENV="/opt/orchestrator/venv"

log() { printf '[ps.sh] %s\n' "$*"; }
die() { printf '[ps.sh] error: %s\n' "$*" >&2; exit "${2:-1}"; }

if [ "$(id -u)" -ne 0 ]; then
  # GCE gives users from the ssh-keys metadata passwordless sudo.
  exec sudo -n -E bash "$0" "$@"
fi

if [ -n "${GPU:-}" ]; then
  die "GPU=${GPU}: the parameter-server image is CPU-only; bake worker images with --role worker" 2
fi

# shellcheck source=/dev/null
. /etc/os-release
[ "${VERSION_CODENAME:-}" = "bookworm" ] || die "this recipe is for Debian 12 (bookworm), not ${PRETTY_NAME:-unknown}"

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)

log "installing Python 3.11 and a virtualenv in $VENV"
apt-get update -q
apt-get install "${APT_OPTS[@]}" ca-certificates python3 python3-venv python3-pip
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
log "installing tensorflow-cpu==$TF_VERSION, google-cloud-storage, scikit-learn"
"$VENV/bin/python" -m pip install -q --no-cache-dir \
  "tensorflow-cpu==$TF_VERSION" \
  "google-cloud-storage==$GCS_VERSION" \
  "scikit-learn==$SKLEARN_VERSION"

# A wrapper, not a symlink: a symlinked venv interpreter would not find its pyvenv.cfg.
cat > /usr/local/bin/python3 <<EOF
#!/bin/sh
exec "$VENV/bin/python3" "\$@"
EOF
chmod 0755 /usr/local/bin/python3

"$VENV/bin/python" - <<EOF
import google.cloud.storage, sklearn, tensorflow as tf
assert tf.__version__ == "$TF_VERSION", tf.__version__
print("tensorflow", tf.__version__, "sklearn", sklearn.__version__)
EOF

apt-get clean
rm -rf /root/.cache/pip /var/lib/apt/lists/*
log "done"
