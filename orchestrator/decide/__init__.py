"""Decisions: replacement, the deadline rule, reconcile; pure, no I/O."""
