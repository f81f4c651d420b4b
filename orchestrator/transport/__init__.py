"""Transports put files on an instance, start processes detached, read logs and stop processes."""
