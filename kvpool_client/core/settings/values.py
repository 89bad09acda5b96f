"""Setting values as users write them: byte sizes, booleans, numbers and lists, from text or YAML.

Each converter takes what a source holds (a string from the environment or a flag, or a
YAML scalar) and returns the typed value, or raises ``ValueError`` with a short phrase
(``not an integer``) that the loader prefixes with the source and the key.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from kvpool_client.core.errors import UsageError

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


class ConfigError(UsageError):
    """A setting is unknown, malformed or inconsistent; the message names its source and key."""

    def __str__(self) -> str:
        return str(self.args[0])  # the message is for people: no error-code prefix


_NOT_BYTES = "not a byte size (examples: 4096, 512MiB, 1GiB)"
_BYTE_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt](?:i?b)?|b)?", re.IGNORECASE)
_UNIT_BYTES = {"": 1, "b": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}


def parse_byte_size(text: str | int) -> int:
    """Parse a byte count such as ``4096``, ``512MiB``, ``1.5G`` or ``64 kib``.

    Units are binary and case-insensitive: K, KB and KiB all mean 1024 bytes (likewise
    M, G, T). A fraction is allowed when the result is a whole number of bytes.

    Args:
        text: the text to parse, or a non-negative int (returned as is).
    Returns:
        The number of bytes.
    Raises:
        ValueError: not a byte size, negative, or not a whole number of bytes.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError("a byte size must be >= 0")
        return text
    match = _BYTE_SIZE_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(_NOT_BYTES)
    number, unit = match.groups()
    size = Fraction(number) * _UNIT_BYTES[(unit or "")[:1].lower()]
    if size.denominator != 1:
        raise ValueError("not a whole number of bytes")
    return int(size)


def format_byte_size(n: int) -> str:
    """Format ``n`` bytes exactly, in the largest binary unit that divides it (``1536MiB``, ``4096``).

    Raises:
        ValueError: ``n`` is negative.
    """
    if n < 0:
        raise ValueError("a byte size must be >= 0")
    for suffix, unit in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


_BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = value.strip().lower() if isinstance(value, str) else ""
    if word not in _BOOL_WORDS:
        raise ValueError("not a boolean (true/false, yes/no, on/off, 1/0)")
    return _BOOL_WORDS[word]


def to_int(value: Any) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError("not an integer")


def to_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("not a number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError("not a number") from None
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ValueError("not a string (quote it in YAML)")


def to_list(value: Any) -> tuple[str, ...]:
    """``a,b`` (text) or a YAML list of strings, as a tuple without blanks."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(part, str) for part in value):
        return tuple(part.strip() for part in value if part.strip())
    raise ValueError("not a comma-separated list (or a YAML list of strings)")


Converter = Callable[[Any], Any]
CONVERTERS: dict[Any, Converter] = {bool: to_bool, int: to_int, float: to_float, str: to_str, tuple: to_list}


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the candidate nearest ``word``, or '' if none is near."""
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
