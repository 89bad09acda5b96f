"""What kvpoolctl reads: argument values, input files and output files.

The ``*_arg`` functions are argparse ``type=`` callables (a bad value exits 2
with argparse's message); the file functions raise :class:`CliError`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

from kvpool_client.admin.exits import CliError, ExitCode
from kvpool_client.core.membership.endpoints import channel_target
from kvpool_client.core.membership.records import check_name
from kvpool_client.core.wire.frames import MAX_HASH_BYTES

_TOKEN_SEPARATORS = re.compile(r"[\s,]+")


def nodes_arg(text: str) -> tuple[str, ...]:
    """``host:port[,host:port...]`` as addresses in order, duplicates dropped."""
    nodes: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        host, colon, port = part.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"{part!r} is not host:port (check --nodes or KVPOOL_NODES)")
        if part not in nodes:
            nodes.append(part)
    if not nodes:
        raise argparse.ArgumentTypeError("no node given: expected host:port[,host:port]")
    return tuple(nodes)


def etcd_arg(text: str) -> str | None:
    """``host:port[,host:port...]`` (``http://`` or ``https://`` allowed) of etcd members; empty: none."""
    endpoints = [p.strip() for p in text.split(",") if p.strip()]
    if not endpoints:
        return None
    try:
        channel_target(endpoints)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (check --etcd or KVPOOL_ETCD_ENDPOINTS)") from None
    return ",".join(endpoints)


def cluster_arg(text: str) -> str:
    """A cluster name: the etcd prefix ``/kvpool/<cluster>/``."""
    try:
        return check_name("cluster name", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# What `config set` may change; placement_version belongs to the client code, not to operators.
CONFIG_SETTINGS = ("block_size", "replicas", "write_quorum")


def setting_arg(text: str) -> tuple[str, int]:
    """``KEY=VALUE`` for ``config set``: a known setting and an integer."""
    key, equals, value = text.partition("=")
    key = key.strip().replace("-", "_")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (keys: {', '.join(CONFIG_SETTINGS)})")
    if key not in CONFIG_SETTINGS:
        raise argparse.ArgumentTypeError(f"unknown setting {key!r}: expected one of {', '.join(CONFIG_SETTINGS)}")
    try:
        return key, int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key} takes an integer, not {value.strip()!r}") from None


def hex_key_arg(text: str) -> bytes:
    """A block hash in hex (an optional ``0x`` prefix is allowed)."""
    digits = text[2:] if text.lower().startswith("0x") else text
    try:
        value = bytes.fromhex(digits)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not hex") from None
    if not 0 < len(value) <= MAX_HASH_BYTES:
        raise argparse.ArgumentTypeError(f"a key is 1..{MAX_HASH_BYTES} bytes, got {len(value)}")
    return value


def name_key(name: str) -> bytes:
    """The key ``--name`` stands for: the sha256 of its UTF-8 bytes."""
    return hashlib.sha256(name.encode("utf-8")).digest()


def positive_float_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def positive_int_arg(text: str) -> int:
    return _int_arg(text, 1)


def non_negative_int_arg(text: str) -> int:
    return _int_arg(text, 0)


def _int_arg(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {text!r}")
    return value


def read_bytes(path: str) -> bytes:
    """The bytes of ``path``, or of stdin for ``-``.

    Raises:
        CliError: USAGE if the file cannot be read.
    """
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CliError(ExitCode.USAGE, f"cannot read {path}: {exc.strerror or exc}") from None


def read_tokens(path: str) -> list[int]:
    """Token ids from a file: a JSON list, or integers separated by whitespace or commas.

    Raises:
        CliError: USAGE if the file cannot be read or holds anything but integers.
    """
    try:
        text = read_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(ExitCode.USAGE, f"{path} is not UTF-8 text: expected token ids") from None
    if text.lstrip().startswith("["):
        return _json_tokens(path, text)
    tokens = []
    for index, word in enumerate(w for w in _TOKEN_SEPARATORS.split(text) if w):
        try:
            tokens.append(int(word))
        except ValueError:
            raise CliError(ExitCode.USAGE, f"{path}: token {index} is {word!r}, expected an integer") from None
    return tokens


def _json_tokens(path: str, text: str) -> list[int]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(ExitCode.USAGE, f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    # bool is an int subclass; true as a token id is surely a mistake.
    bad = next((i for i, t in enumerate(value) if type(t) is not int), None) if isinstance(value, list) else 0
    if not isinstance(value, list) or bad is not None:
        raise CliError(ExitCode.USAGE, f"{path}: expected a JSON list of integers (item {bad} is not)")
    return value


def write_bytes(path: str, data: memoryview | bytes) -> None:
    """Write ``data`` to ``path`` (replacing it), or to stdout for ``-``.

    Raises:
        CliError: USAGE if the file cannot be written.
    """
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        Path(path).write_bytes(data)
    except OSError as exc:
        raise CliError(ExitCode.USAGE, f"cannot write {path}: {exc.strerror or exc}") from None
