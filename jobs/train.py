"""Training payload entry point: ``python <jobs_dir>/train.py --task task.json`` (cwd = the task's disk).

Reads task.json written by the orchestrator controller and runs one task of a TensorFlow job:

- async mode (ParameterServerStrategy): role ``ps`` / ``worker`` serve a gRPC tf.distribute.Server
  until killed; role ``chief`` runs the ClusterCoordinator training loop and the job's I/O.
- sync mode (MultiWorkerMirroredStrategy): every ``worker`` trains; worker 0 does the job's I/O.

The chief writes ``metrics.jsonl``, ``checkpoints/`` and ``result.json`` into the task's ``storage``
directory and checkpoints at once when a new file appears in ``storage/notices/``.
Exit codes: 0 done, 1 unexpected error, 2 bad task.json, 3 cluster failure (PS or peer lost, cluster
unreachable); the controller restarts the job from the last checkpoint. See README.md beside this file.
This file only puts its own directory on sys.path, so jobs/ can be copied anywhere.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# TF 2.21's oneDNN CPU kernels crash (SIGSEGV / heap corruption) on some odd per-worker batches (15, 47)
# with more than one intra-op thread; the plain Eigen kernels do not. GPUs do not use oneDNN.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from tfjob.main import run  # noqa: E402

if __name__ == "__main__":
    run()
