#!/usr/bin/env bash
# GPU worker image recipe for a Deep Learning VM base image: the framework and the payload's dependencies
# on top of the NVIDIA driver the base image brings.
#
# Run by `orchestrator image bake --role worker --gpu <gpu> --framework tensorflow|pytorch` on a builder VM
# booted from projects/deeplearning-platform-release/global/images/family/common-cu129-ubuntu-2204-nvidia-580
# (Ubuntu 22.04, NVIDIA driver R580, CUDA 12.9: Volta, Turing, Ampere, Ada, Hopper and Blackwell GPUs); by a
# gce job's VMs at first boot (their startup script, with KEEP_IMAGE_FRAMEWORK=1: a Deep Learning VM PyTorch
# family keeps its own torch); or by hand:  FRAMEWORK=pytorch GPU=h100 bash gpu-worker.sh
# Idempotent: a second run re-checks every step and changes nothing that is already in place.
#
# What goes where:
#   - the driver: the base image's (this recipe never installs one; images/worker.sh does, on Debian 12);
#   - FRAMEWORK=tensorflow: `tensorflow[and-cuda]` (the CUDA runtime and cuDNN as the pip wheels TF was
#     built against), google-cloud-storage, scikit-learn: what jobs/tfjob imports;
#   - FRAMEWORK=pytorch: torch built for CUDA 12.8 from PyTorch's wheel index (its CUDA libraries come as
#     wheels too), torchft (replica groups: jobs/torchjob/ft_worker.py), numpy, google-cloud-storage,
#     scikit-learn: what jobs/torchjob imports;
#   - a virtualenv in $VENV; /usr/local/bin/python3 runs it, so the controller's `python3 jobs/...` over SSH
#     finds the framework.
set -euo pipefail

# ---------------------------------------------------------------- pinned versions (pyproject.toml's extras)
TF_VERSION="2.21.0"
TORCH_VERSION="2.13.0"
TORCH_INDEX="https://download.pytorch.org/whl/cu128"
TORCHFT_VERSION="0.2.0"             # torchft: torch >= 2.7, so the Deep Learning VM's torch 2.9 takes it too
GCS_VERSION="3.17.1"                # google-cloud-storage
SKLEARN_VERSION="1.9.1"             # scikit-learn
VENV="/opt/orchestrator/venv"
FRAMEWORK="${FRAMEWORK:-tensorflow}"  # tensorflow | pytorch
GPU="${GPU:-}"                      # catalog key: t4 | v100 | l4 | rtx-pro-6000 | a100 | a100-80gb | h100 | h200 | b200
DRIVER_WAIT_S="${DRIVER_WAIT_S:-900}"  # a Deep Learning VM may finish its driver set-up after first boot
SKIP_GPU_CHECK="${SKIP_GPU_CHECK:-0}"  # 1: do not require the framework to see a GPU at the end
KEEP_IMAGE_FRAMEWORK="${KEEP_IMAGE_FRAMEWORK:-0}"  # 1: a framework the image's python3 imports is kept as is

log() { printf '[gpu-worker.sh] %s\n' "$*"; }
die() { printf '[gpu-worker.sh] error: %s\n' "$*" >&2; exit "${2:-1}"; }

if [ "$(id -u)" -ne 0 ]; then
  # GCE gives users from the ssh-keys metadata passwordless sudo.
  exec sudo -n -E bash "$0" "$@"
fi

case "$FRAMEWORK" in
  tensorflow | pytorch) ;;
  *) die "unknown FRAMEWORK '$FRAMEWORK'; expected tensorflow or pytorch" 2 ;;
esac
case "$GPU" in
  k80 | p100 | p4) die "GPU=$GPU: no Deep Learning VM driver route and no CUDA 12.8 framework build for it" 3 ;;
  t4 | v100 | l4 | rtx-pro-6000 | a100 | a100-80gb | h100 | h200 | b200 | "") ;;
  *) die "unknown GPU '$GPU'" 2 ;;
esac

# ---------------------------------------------------------------- the base image's driver
if [ "$SKIP_GPU_CHECK" != "1" ]; then
  log "waiting for the base image's NVIDIA driver (nvidia-smi), up to ${DRIVER_WAIT_S}s"
  waited=0
  until nvidia-smi >/dev/null 2>&1; do
    [ "$waited" -lt "$DRIVER_WAIT_S" ] || die "no working NVIDIA driver after ${DRIVER_WAIT_S}s: is the base image a Deep Learning VM family with a driver (…-nvidia-580)?"
    sleep 10; waited=$((waited + 10))
  done
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
fi

# ---------------------------------------------------------------- Python + the framework
export DEBIAN_FRONTEND=noninteractive
if ! python3 -m venv --help >/dev/null 2>&1; then
  apt-get update -q
  apt-get install -y -q python3-venv python3-pip
fi
module=torch
[ "$FRAMEWORK" = "tensorflow" ] && module=tensorflow
image_has=0  # the image brings the framework (a Deep Learning VM PyTorch family): the venv sees it
if [ "$KEEP_IMAGE_FRAMEWORK" = "1" ] && python3 -c "import $module" >/dev/null 2>&1; then image_has=1; fi
venv_flags=()
[ "$image_has" = "1" ] && venv_flags=(--system-site-packages)
[ -x "$VENV/bin/python" ] || python3 -m venv "${venv_flags[@]}" "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
common=("google-cloud-storage==$GCS_VERSION" "scikit-learn==$SKLEARN_VERSION")
[ "$FRAMEWORK" = "pytorch" ] && common+=("torchft==$TORCHFT_VERSION")
if [ "$image_has" = "1" ]; then
  log "keeping the image's $module; installing numpy, ${common[*]}"
  "$VENV/bin/python" -m pip install -q --no-cache-dir numpy "${common[@]}"
elif [ "$FRAMEWORK" = "tensorflow" ]; then
  log "installing tensorflow[and-cuda]==$TF_VERSION, google-cloud-storage, scikit-learn"
  "$VENV/bin/python" -m pip install -q --no-cache-dir "tensorflow[and-cuda]==$TF_VERSION" "${common[@]}"
else
  log "installing torch==$TORCH_VERSION (CUDA 12.8, $TORCH_INDEX), numpy, ${common[*]}"
  "$VENV/bin/python" -m pip install -q --no-cache-dir --extra-index-url "$TORCH_INDEX" \
    "torch==$TORCH_VERSION" numpy "${common[@]}"
fi

# A wrapper, not a symlink: a symlinked venv interpreter would not find its pyvenv.cfg.
cat > /usr/local/bin/python3 <<WRAP
#!/bin/sh
exec "$VENV/bin/python3" "\$@"
WRAP
chmod 0755 /usr/local/bin/python3

# ---------------------------------------------------------------- checks: the payload's imports, the GPU
if [ "$image_has" = "1" ]; then
  "$VENV/bin/python" -c "import google.cloud.storage, numpy, sklearn, $module; print('$module', $module.__version__, '(the image)')"
  [ "$FRAMEWORK" = "pytorch" ] && "$VENV/bin/python" -c "import torchft"
fi
if [ "$FRAMEWORK" = "tensorflow" ]; then
  [ "$image_has" = "1" ] || "$VENV/bin/python" -c "import google.cloud.storage, sklearn, tensorflow as tf; assert tf.__version__ == '$TF_VERSION'; print('tensorflow', tf.__version__)"
  check='import tensorflow as tf, sys; g = tf.config.list_physical_devices("GPU"); print("TensorFlow sees", g); sys.exit(0 if g else 1)'
else
  [ "$image_has" = "1" ] || "$VENV/bin/python" -c "import google.cloud.storage, numpy, sklearn, torch, torch.distributed.checkpoint, torchft; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  check='import torch, sys; print("torch sees", torch.cuda.device_count(), "GPU(s)", torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""); sys.exit(0 if torch.cuda.is_available() else 1)'
fi
if [ "$SKIP_GPU_CHECK" != "1" ]; then
  "$VENV/bin/python" -c "$check" || die "$FRAMEWORK does not see a GPU"
fi

# ---------------------------------------------------------------- shrink the image
apt-get clean
rm -rf /root/.cache/pip /var/lib/apt/lists/*
log "done"
