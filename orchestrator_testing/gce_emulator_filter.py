"""List ``filter`` expressions and page tokens of the Compute Engine REST API, for the emulator.

Supports what callers actually send: ``field op value`` comparisons (``=``, ``!=``, ``:``, ``>``, ``<``,
``>=``, ``<=``, and the legacy regex operators ``eq`` / ``ne``), dotted paths such as
``labels.orch-job`` or ``scheduling.preemptible``, parentheses, ``AND`` / ``OR`` / ``NOT``, and
juxtaposed expressions (an implicit ``AND``), e.g. ``(labels.orchestrator = "1") (status = RUNNING)``.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

Predicate = Callable[[dict[str, Any]], bool]

_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<paren>[()])
      | (?P<dq>"(?:[^"\\]|\\.)*")
      | (?P<sq>'(?:[^'\\]|\\.)*')
      | (?P<op>!=|>=|<=|=|:|>|<)
      | (?P<word>[^\s()=!<>:"']+)
    )""",
    re.VERBOSE,
)
_COMPARISON_OPS = {"=", "!=", ":", ">", "<", ">=", "<=", "eq", "ne"}


class FilterError(ValueError):
    """The expression cannot be parsed (GCE answers 400 invalid)."""


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None or m.end() == pos:
            raise FilterError(f"cannot parse filter near {text[pos : pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        value = m.group(kind)
        if kind in ("dq", "sq"):
            tokens.append(("str", re.sub(r"\\(.)", r"\1", value[1:-1])))
        else:
            tokens.append((kind, value))
    return tokens


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise FilterError("unexpected end of filter")
        self.pos += 1
        return tok

    def parse_or(self) -> Predicate:
        parts = [self.parse_and()]
        while self.peek() == ("word", "OR"):
            self.take()
            parts.append(self.parse_and())
        if len(parts) == 1:
            return parts[0]
        return lambda obj: any(p(obj) for p in parts)

    def parse_and(self) -> Predicate:
        parts = [self.parse_unary()]
        while (tok := self.peek()) is not None and tok not in (("paren", ")"), ("word", "OR")):
            if tok == ("word", "AND"):
                self.take()
            parts.append(self.parse_unary())
        if len(parts) == 1:
            return parts[0]
        return lambda obj: all(p(obj) for p in parts)

    def parse_unary(self) -> Predicate:
        tok = self.take()
        if tok == ("word", "NOT"):
            inner = self.parse_unary()
            return lambda obj: not inner(obj)
        if tok == ("paren", "("):
            inner = self.parse_or()
            if self.take() != ("paren", ")"):
                raise FilterError("missing ')'")
            return inner
        if tok[0] != "word":
            raise FilterError(f"expected a field name, got {tok[1]!r}")
        op_kind, op = self.take()
        if op not in _COMPARISON_OPS or op_kind not in ("op", "word"):
            raise FilterError(f"expected a comparison operator after {tok[1]!r}, got {op!r}")
        value_kind, value = self.take()
        if value_kind not in ("str", "word"):
            raise FilterError(f"expected a value after {op!r}")
        return _comparison(tok[1].split("."), op, value)


def _leaves(obj: Any, path: Sequence[str]) -> list[Any]:
    """Values at a dotted path; a list on the way matches any of its elements (like GCE)."""
    if not path:
        return [obj]
    if isinstance(obj, list):
        return [leaf for item in obj for leaf in _leaves(item, path)]
    if isinstance(obj, dict) and path[0] in obj:
        return _leaves(obj[path[0]], path[1:])
    return []


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _ordered(leaf: str, value: str, op: str) -> bool:
    left: float | str
    right: float | str
    try:
        left, right = float(leaf), float(value)
    except ValueError:
        left, right = leaf, value
    if op == ">":
        return left > right  # type: ignore[operator]
    if op == "<":
        return left < right  # type: ignore[operator]
    if op == ">=":
        return left >= right  # type: ignore[operator]
    return left <= right  # type: ignore[operator]


def _comparison(path: list[str], op: str, value: str) -> Predicate:
    if op in ("eq", "ne"):
        try:
            regex = re.compile(value)
        except re.error as exc:
            raise FilterError(f"bad regular expression {value!r}: {exc}") from exc

        def match_regex(obj: dict[str, Any]) -> bool:
            hit = any(regex.fullmatch(_as_text(leaf)) for leaf in _leaves(obj, path))
            return hit if op == "eq" else not hit

        return match_regex

    def match(obj: dict[str, Any]) -> bool:
        leaves = [_as_text(leaf) for leaf in _leaves(obj, path) if not isinstance(leaf, dict | list)]
        present = bool(_leaves(obj, path))
        if op == ":" and value == "*":
            return present
        if op in ("=", ":"):
            return any(fnmatch.fnmatchcase(leaf, value) for leaf in leaves)
        if op == "!=":
            return not any(fnmatch.fnmatchcase(leaf, value) for leaf in leaves)
        return any(_ordered(leaf, value, op) for leaf in leaves)

    return match


def compile_filter(text: str | None) -> Predicate:
    """Compile a GCE list filter; an empty filter matches everything. Raises ``FilterError``."""
    if not text or not text.strip():
        return lambda obj: True
    parser = _Parser(_tokenize(text))
    predicate = parser.parse_or()
    if parser.peek() is not None:
        raise FilterError(f"unexpected {parser.peek()!r} in filter")
    return predicate


def encode_page_token(offset: int, query_key: str) -> str:
    raw = json.dumps({"o": offset, "q": query_key}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_page_token(token: str, query_key: str) -> int:
    """The offset a token stands for; a token from a different query is rejected, as GCE does."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        offset = int(data["o"])
        same_query = data["q"] == query_key
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise FilterError(f"invalid page token {token!r}") from exc
    if not same_query or offset < 0:
        raise FilterError(f"page token {token!r} does not belong to this query")
    return offset
