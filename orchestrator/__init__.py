"""orchestrator: deep-learning training on transient (spot / preemptible) GPUs."""

__version__ = "0.1.0"
