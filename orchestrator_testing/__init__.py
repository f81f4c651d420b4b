"""Test doubles of the clouds the orchestrator drives (e.g. the Compute Engine REST emulator)."""
