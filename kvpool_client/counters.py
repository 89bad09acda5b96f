"""What a client has done since it started, for the engine that embeds it (hits, misses, bytes, errors).

An engine exports these next to its own metrics: a pool that is configured but unreachable
then shows as errors by node instead of a quiet drop in hit rate. Thread-safe; a snapshot is
a plain record.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from kvpool_client.core.errors import ErrorCode
from kvpool_client.results import GetResult, PutResult

_OK = ErrorCode.OK  # read once: an enum member read off its class is a descriptor call each time (Python 3.11)


@dataclass(frozen=True, slots=True)
class ClientStats:
    """Totals since the client started.

    Attributes:
        gets, get_hits, get_misses: get calls, and the keys that came back OK or not.
        bytes_received: bytes of the blocks gets returned.
        puts, blocks_stored, blocks_not_stored: put calls; keys stored now or found stored
            (OK, ALREADY_EXISTS, BUSY), and keys that failed.
        lookups, lookup_keys, lookup_hits: lookup calls, keys asked about, leading keys found.
        node_errors: per node (``id (address)``), failures by error code name.
    """

    gets: int = 0
    get_hits: int = 0
    get_misses: int = 0
    bytes_received: int = 0
    puts: int = 0
    blocks_stored: int = 0
    blocks_not_stored: int = 0
    lookups: int = 0
    lookup_keys: int = 0
    lookup_hits: int = 0
    node_errors: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


_TOTALS = tuple(f.name for f in fields(ClientStats) if f.type == "int")


class ClientCounters:
    """The running totals behind :class:`ClientStats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # A plain dict of every total: its items update faster than a Counter's (a get's bookkeeping).
        self._totals: dict[str, int] = dict.fromkeys(_TOTALS, 0)
        self._errors: dict[str, Counter[str]] = {}

    def got(self, result: GetResult) -> None:
        statuses = result.statuses
        hits = statuses.count(_OK)
        received = 0
        for buffer in result.buffers:  # a buffer where a key is OK; a loop runs no generator frame
            if buffer is not None:
                received += len(buffer)
        totals = self._totals
        with self._lock:
            totals["gets"] += 1
            totals["get_hits"] += hits
            totals["get_misses"] += len(statuses) - hits
            totals["bytes_received"] += received

    def put(self, result: PutResult) -> None:
        failed = len(result.failures())
        totals = self._totals
        with self._lock:
            totals["puts"] += 1
            totals["blocks_stored"] += len(result) - failed
            totals["blocks_not_stored"] += failed

    def looked_up(self, keys: int, hits: int) -> None:
        totals = self._totals
        with self._lock:
            totals["lookups"] += 1
            totals["lookup_keys"] += keys
            totals["lookup_hits"] += hits

    def failed(self, node: str, code: ErrorCode) -> None:
        with self._lock:
            self._errors.setdefault(node, Counter())[code.name] += 1

    def snapshot(self) -> ClientStats:
        with self._lock:
            errors = {node: MappingProxyType(dict(codes)) for node, codes in self._errors.items()}
            return ClientStats(**self._totals, node_errors=MappingProxyType(errors))
