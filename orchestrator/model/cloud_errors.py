"""Typed cloud errors: each says what to skip next (stockout -> next zone, quota -> next region)."""

from __future__ import annotations


class ProviderError(Exception):
    """Base of every provider error. Fields are constructor arguments, never bolted on later."""

    retryable: bool = False

    def __init__(self, message: str, *, zone: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.zone = zone


class CapacityError(ProviderError):
    """The zone has no capacity for this shape (GCE ZONE_RESOURCE_POOL_EXHAUSTED): try the next zone."""

    def __init__(self, message: str, *, zone: str, resource: str = "") -> None:
        super().__init__(message, zone=zone)
        self.resource = resource


class QuotaError(ProviderError):
    """A regional quota is exhausted (GCE QUOTA_EXCEEDED): try the next region or ask for more quota."""

    def __init__(self, message: str, *, zone: str | None, region: str, metric: str) -> None:
        super().__init__(message, zone=zone)
        self.region = region
        self.metric = metric


class AuthError(ProviderError):
    """Credentials missing or lacking permission: fail fast, say what to fix."""


class InvalidRequestError(ProviderError):
    """The cloud rejected the request as malformed (unknown machine type, bad image, ...)."""


class TransientError(ProviderError):
    """5xx, timeouts, rate limits: retried with bounded backoff."""

    retryable = True
