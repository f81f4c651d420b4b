"""Providers create, delete and list instances; nothing else is asked of them on the hot path."""
