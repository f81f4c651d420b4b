#!/usr/bin/env bash
# Worker image recipe (GPU): NVIDIA driver + CUDA runtime + cuDNN + Python 3.11 + TensorFlow 2.21
# + google-cloud-storage + scikit-learn, on Debian 12 (bookworm) on Compute Engine.
#
# Run by `orchestrator image bake --role worker --gpu <gpu>` on a builder VM with the GPU attached,
# or by hand:  GPU=v100 bash worker.sh
# Idempotent: a second run re-checks every step and changes nothing that is already in place.
#
# What goes where:
#   - the NVIDIA driver (kernel module via DKMS + libcuda) from NVIDIA's CUDA repository for Debian 12;
#   - the CUDA runtime libraries and cuDNN as the pip wheels TensorFlow was built against
#     (`tensorflow[and-cuda]`: CUDA 12.x >= 12.5, cuDNN 9.x >= 9.3 for TF 2.21), so their versions always
#     match TensorFlow's; no system-wide CUDA toolkit is needed to run TensorFlow;
#   - Python 3.11 (Debian 12's python3) with a virtualenv in $VENV; /usr/local/bin/python3 runs it, so
#     the controller's `python3 jobs/train.py ...` over SSH finds TensorFlow.
#
# GPUs and TensorFlow (compute capability support is AS BEST WE KNOW; verify before relying on it):
#   - TF 2.21 wheels carry kernels for sm_60/sm_70/sm_80/sm_89 (+ PTX for newer): P100 (6.0), V100 (7.0),
#     T4 (7.5), A100 (8.0), L4 (8.9), H100 (9.0) all work with the R580 driver.
#   - K80 (GK210, compute capability 3.7) does NOT run TF 2.21: CUDA 12 dropped Kepler, and the K80's
#     last driver branch is R470 (CUDA 11.4 at most). As best we know, the TF pip wheels that still
#     carry Kepler code are TF 2.4-2.11 (built with sm_35 SASS, which runs on 3.7; CUDA 11.x);
#     TF 1.x and 2.0-2.3 also support 3.5/3.7. TF 2.12/2.13 (CUDA 11.8) are unverified; TF >= 2.14
#     (CUDA 12) cannot. Those old versions need Python <= 3.10 (Debian 12 has 3.11) and Keras 2, while
#     jobs/ uses TF 2.21 / Keras 3 APIs, so this recipe refuses GPU=k80 instead of baking an image the
#     payload cannot use. GCE also retired the K80 in 2024.
#   - P100 and V100 need the proprietary kernel module (the open one starts at Turing) and R580 is
#     their last driver branch: keep NVIDIA_DRIVER_BRANCH at 580 for them.
set -euo pipefail

# ---------------------------------------------------------------- pinned versions
NVIDIA_REPO="https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64"
CUDA_KEYRING_DEB="cuda-keyring_1.1-1_all.deb"
NVIDIA_DRIVER_BRANCH="580"          # cuda-drivers-580; supports CUDA 12.x and 13.0
K80_DRIVER_BRANCH="470"             # legacy branch, CUDA <= 11.4 (for reference: see the K80 note above)
TF_VERSION="2.21.0"
GCS_VERSION="3.17.1"                # google-cloud-storage
SKLEARN_VERSION="1.9.1"             # scikit-learn
VENV="/opt/orchestrator/venv"
GPU="${GPU:-}"                      # catalog key: p100 | v100 | t4 | l4 | a100 | h100 (k80: refused)
SKIP_GPU_CHECK="${SKIP_GPU_CHECK:-0}"  # 1: do not require TensorFlow to see a GPU at the end

log() { printf '[worker.sh] %s\n' "$*"; }
die() { printf '[worker.sh] error: %s\n' "$*" >&2; exit "${2:-1}"; }

if [ "$(id -u)" -ne 0 ]; then
  # GCE gives users from the ssh-keys metadata passwordless sudo.
  exec sudo -n -E bash "$0" "$@"
fi

case "$GPU" in
  k80)
    die "GPU=k80: TensorFlow ${TF_VERSION} needs CUDA 12, which does not support the K80 (compute capability 3.7; its last driver is R${K80_DRIVER_BRANCH}, CUDA <= 11.4). Bake for p100, v100, t4, l4, a100 or h100, or build a legacy TF <= 2.11 image by hand (see images/README.md)." 3
    ;;
  p100 | v100 | t4 | l4 | a100 | h100 | "") ;;
  *) die "unknown GPU '$GPU'; expected p100, v100, t4, l4, a100 or h100" 2 ;;
esac

# shellcheck source=/dev/null
. /etc/os-release
[ "${VERSION_CODENAME:-}" = "bookworm" ] || die "this recipe is for Debian 12 (bookworm), not ${PRETTY_NAME:-unknown}"

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)

# ---------------------------------------------------------------- apt sources: contrib (NVIDIA's docs ask for it)
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  if ! grep -q '^Components:.*contrib' /etc/apt/sources.list.d/debian.sources; then
    log "enabling contrib and non-free in debian.sources"
    sed -i 's/^Components: main.*$/Components: main contrib non-free non-free-firmware/' \
      /etc/apt/sources.list.d/debian.sources
  fi
elif [ -f /etc/apt/sources.list ] && ! grep -q 'contrib' /etc/apt/sources.list; then
  log "enabling contrib and non-free in sources.list"
  sed -i -E 's/^(deb .* bookworm[a-z-]*) main$/\1 main contrib non-free non-free-firmware/' /etc/apt/sources.list
fi

# ---------------------------------------------------------------- NVIDIA's CUDA repository for Debian 12
if ! dpkg -s cuda-keyring >/dev/null 2>&1; then
  log "adding NVIDIA's CUDA repository ($NVIDIA_REPO)"
  apt-get update -q
  apt-get install "${APT_OPTS[@]}" ca-certificates curl
  tmp="$(mktemp -d)"
  curl -fsSL --retry 5 -o "$tmp/$CUDA_KEYRING_DEB" "$NVIDIA_REPO/$CUDA_KEYRING_DEB"
  dpkg -i "$tmp/$CUDA_KEYRING_DEB"
  rm -rf "$tmp"
fi
apt-get update -q

# ---------------------------------------------------------------- kernel headers + driver (DKMS)
kernel="$(uname -r)"
case "$kernel" in
  *-cloud-amd64) headers_meta="linux-headers-cloud-amd64" ;;
  *) headers_meta="linux-headers-amd64" ;;
esac
log "installing kernel headers for $kernel and the NVIDIA driver (branch $NVIDIA_DRIVER_BRANCH)"
# The meta package makes DKMS rebuild the module for kernels that later upgrades install.
apt-get install "${APT_OPTS[@]}" "linux-headers-$kernel" "$headers_meta" dkms
# Kernel module flavour: Pascal / Volta only work with the proprietary module; Turing and newer work with
# both and NVIDIA recommends the open one. Naming it explicitly makes apt fail loudly rather than pick the
# wrong flavour if the cuda-drivers meta package changes its default.
case "$GPU" in
  p100 | v100 | "") kernel_module="nvidia-kernel-dkms" ;;
  *) kernel_module="nvidia-kernel-open-dkms" ;;
esac
apt-get install "${APT_OPTS[@]}" "cuda-drivers-$NVIDIA_DRIVER_BRANCH" "$kernel_module"

# Nouveau must not claim the GPU (the GCE cloud kernel normally lacks it; harmless if so).
if [ ! -f /etc/modprobe.d/blacklist-nouveau.conf ]; then
  printf 'blacklist nouveau\noptions nouveau modeset=0\n' > /etc/modprobe.d/blacklist-nouveau.conf
fi

# ---------------------------------------------------------------- Python 3.11 + TensorFlow
log "installing Python 3.11 and a virtualenv in $VENV"
apt-get install "${APT_OPTS[@]}" python3 python3-venv python3-pip
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
log "installing tensorflow[and-cuda]==$TF_VERSION (CUDA runtime + cuDNN wheels), google-cloud-storage, scikit-learn"
"$VENV/bin/python" -m pip install -q --no-cache-dir \
  "tensorflow[and-cuda]==$TF_VERSION" \
  "google-cloud-storage==$GCS_VERSION" \
  "scikit-learn==$SKLEARN_VERSION"

# A wrapper, not a symlink: a symlinked venv interpreter would not find its pyvenv.cfg.
cat > /usr/local/bin/python3 <<EOF
#!/bin/sh
exec "$VENV/bin/python3" "\$@"
EOF
chmod 0755 /usr/local/bin/python3

# ---------------------------------------------------------------- checks
"$VENV/bin/python" - <<EOF
import google.cloud.storage, sklearn, tensorflow as tf
assert tf.__version__ == "$TF_VERSION", tf.__version__
print("tensorflow", tf.__version__, "sklearn", sklearn.__version__)
EOF

if [ "$SKIP_GPU_CHECK" != "1" ]; then
  modprobe nvidia || die "the nvidia kernel module does not load (see dmesg); if nouveau was loaded, reboot and re-run"
  nvidia-smi || die "nvidia-smi failed"
  "$VENV/bin/python" -c 'import tensorflow as tf, sys
gpus = tf.config.list_physical_devices("GPU")
print("TensorFlow sees", gpus)
sys.exit(0 if gpus else 1)' || die "TensorFlow does not see a GPU"
fi

# ---------------------------------------------------------------- shrink the image
apt-get clean
rm -rf /root/.cache/pip /var/lib/apt/lists/*
log "done"
