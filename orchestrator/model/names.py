"""'Did you mean ...?' for a mistyped name: one helper for every lookup of a GPU, zone, machine type or book."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# difflib's default cut-off (0.6) still finds 'p100' for 'p10O' and 'us-central1-c' for 'us-centrl1-c',
# and suggests nothing for a name that shares little with any known one.
_CUTOFF = 0.6


def close_names(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names nearest to ``name`` (case-insensitive), closest first."""
    by_lower = {k.lower(): k for k in known}
    return [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=_CUTOFF)]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """'did you mean p100? ' (or 'did you mean a, b or c? '), or '' when nothing is close."""
    near = close_names(name, known)
    if not near:
        return ""
    options = near[0] if len(near) == 1 else f"{', '.join(near[:-1])} or {near[-1]}"
    return f"did you mean {options}? "


def unknown_name(name: str, what: str, known: Iterable[str]) -> str:
    """"'p10O' is not a GPU type; did you mean p100? known: k80, p100, ..." (one line, the fix first)."""
    names = list(known)
    return f"'{name}' is not {what}; {did_you_mean(name, names)}known: {', '.join(names)}"
