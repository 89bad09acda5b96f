"""The client side of each benchmarked system, behind one small interface.

A driver turns a list of :class:`~bench.harness.workload.BlockRef` into its own request
form *before* timing (:meth:`Driver.prepare`: kvpool keys, Redis key bytes, a packed
socket request), then performs the op inside the timed section. Every driver raises
:class:`BenchError` when a system answers anything but full success, so a cell never
reports the speed of failing requests.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import redis

from bench import mooncake_peer
from bench.harness import sockio
from bench.harness.workload import REGION_BYTES, BlockRef, region
from kvpool_client import BlockKey, ClientConfig, ErrorCode, KVPoolClient, Namespace
from kvpool_client.core.wire.one_key import GET_ONE_ANSWER_SIZE, decode_get_one, encode_get_one_request

_DELETE_CHUNK = 1024


class BenchError(RuntimeError):
    """A system failed or returned wrong bytes: the cell is invalid."""


class Driver(Protocol):
    stores: bool  # True if what a put stores can be read back (kvpool, Redis)

    def prepare(self, refs: list[BlockRef], block_size: int) -> Any: ...

    def put(self, request: Any, sources: Sequence[memoryview]) -> None: ...

    def get(self, request: Any, targets: Sequence[np.ndarray]) -> Sequence[Any]:
        """Fetch blocks; returns the buffers now holding them (``targets`` when zero-copy)."""
        ...

    def forget(self, refs: list[BlockRef]) -> None: ...

    def close(self) -> None: ...


class KvpoolDriver:
    """kvpool's blocking client, one per worker process, with its pooled data connections (two
    at once for a batch of 8 MiB and more: ``streams_per_node``).

    ``transport`` is ``tcp`` (the baselines are sockets) or ``shm``: gets copied out
    of the daemon's arena, as an engine on the daemon's node reads them.
    """

    stores = True

    def __init__(self, endpoint: str, transport: str = "tcp", streams: int | None = None) -> None:
        # The rest of the settings from the KVPOOL_* environment, as an engine's client takes them.
        config = ClientConfig.from_env(nodes=(endpoint,), transport=transport)
        if streams is not None:
            config = replace(config, streams_per_node=streams)
        self._client = KVPoolClient(config=config)
        self._namespace = Namespace("bench", "u8", "raw").id

    def prepare(self, refs: list[BlockRef], block_size: int) -> Any:
        return [BlockKey(self._namespace, r.key) for r in refs]

    def put(self, request: Any, sources: Sequence[memoryview]) -> None:
        result = self._client.put(request, sources)
        if result.stored != len(request):
            raise BenchError(f"kvpool put stored {result.stored}/{len(request)}: {result.failures()[:3]}")

    def get(self, request: Any, targets: Sequence[np.ndarray]) -> Sequence[Any]:
        result = self._client.get(request, into=targets)
        if result.hits != len(request):
            raise BenchError(f"kvpool get hit {result.hits}/{len(request)}: {result.failures()[:3]}")
        return targets

    def forget(self, refs: list[BlockRef]) -> None:
        for start in range(0, len(refs), _DELETE_CHUNK):
            self._client.delete(self.prepare(refs[start : start + _DELETE_CHUNK], 0))

    def close(self) -> None:
        self._client.close()


class KvpoolWireDriver(KvpoolDriver):
    """kvpool's one-key GET frames over a plain blocking socket, none of the SDK around them:
    the most a Python client of the daemon gets out of it (single gets; puts go through the SDK).
    """

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        info = self._client.server_info(endpoint)
        host, _, port = info.data_endpoints["tcp"].rpartition(":")
        self._address = (host, int(port))
        self._sock: socket.socket | None = None
        self._limits = info.limits
        self._ids = itertools.count(1)

    def get(self, request: Any, targets: Sequence[np.ndarray]) -> Sequence[Any]:
        if len(request) != 1:
            raise BenchError("kvpool-wire reads one key per get")
        if self._sock is None:
            self._sock = socket.create_connection(self._address)
            sockio.tune(self._sock)
        try:
            self._get_one(self._sock, request[0], targets[0].data)
        except BaseException:  # the stream is out of step: the next get opens another connection
            self._sock.close()
            self._sock = None
            raise
        return targets

    def _get_one(self, sock: socket.socket, key: BlockKey, target: memoryview) -> None:
        request_id = next(self._ids)
        sock.sendall(encode_get_one_request(request_id, key.namespace, key.hash))
        one = decode_get_one(sock.recv(GET_ONE_ANSWER_SIZE), request_id, self._limits)
        if one is None or one[0] != ErrorCode.OK or one[1] != len(target):
            raise BenchError(f"kvpool-wire expected a {len(target)}-byte block, got the answer {one}")
        sockio.recv_views(sock, [target])

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        super().close()


class RedisDriver:
    """redis-py with the hiredis parser: SET/GET for one block, MSET/MGET for a batch.

    A get copies each value into its destination, where kvpool's gets land: an engine
    wants the block in its own tensor, not in a new ``bytes`` object.
    """

    stores = True

    def __init__(self, endpoint: str) -> None:
        host, _, port = endpoint.rpartition(":")
        self._redis = redis.Redis(host=host, port=int(port), socket_timeout=60)
        self._redis.ping()

    def prepare(self, refs: list[BlockRef], block_size: int) -> Any:
        return [r.key for r in refs]

    def put(self, request: Any, sources: Sequence[memoryview]) -> None:
        if len(request) == 1:
            ok = self._redis.set(request[0], sources[0])
        else:
            ok = self._redis.mset(dict(zip(request, sources, strict=True)))
        if not ok:
            raise BenchError(f"redis put of {len(request)} keys failed")

    def get(self, request: Any, targets: Sequence[np.ndarray]) -> Sequence[Any]:
        values = [self._redis.get(request[0])] if len(request) == 1 else self._redis.mget(request)
        if any(v is None for v in values):
            raise BenchError(f"redis get missed {sum(v is None for v in values)}/{len(request)} keys")
        for target, value in zip(targets, values, strict=True):
            if len(value) != target.nbytes:
                raise BenchError(f"redis returned {len(value)} bytes for a {target.nbytes}-byte block")
            target[:] = np.frombuffer(value, dtype=np.uint8)
        return targets

    def forget(self, refs: list[BlockRef]) -> None:
        for start in range(0, len(refs), _DELETE_CHUNK):
            self._redis.delete(*(r.key for r in refs[start : start + _DELETE_CHUNK]))

    def close(self) -> None:
        self._redis.close()


class SocketDriver:
    """One blocking TCP connection to the stream server of :mod:`bench.harness.servers`."""

    stores = False

    def __init__(self, endpoint: str, worker: int) -> None:
        host, _, port = endpoint.rpartition(":")
        self._sock = socket.create_connection((host, int(port)))
        sockio.tune(self._sock)
        self._base = worker * REGION_BYTES  # the server holds every worker's region back to back

    def prepare(self, refs: list[BlockRef], block_size: int) -> Any:
        offsets = np.array([self._base + r.offset for r in refs], dtype="<u8")
        return sockio.HEADER.pack(sockio.GET, block_size, len(refs)) + offsets.tobytes()

    def put(self, request: Any, sources: Sequence[memoryview]) -> None:
        head = sockio.HEADER.pack(sockio.PUT, len(sources[0]), len(sources))
        sockio.send_views(self._sock, [head, *sources])
        if sockio.recv_exact(self._sock, 1) != sockio.ACK:
            raise BenchError("socket server did not acknowledge a put")

    def get(self, request: Any, targets: Sequence[np.ndarray]) -> Sequence[Any]:
        self._sock.sendall(request)
        sockio.recv_views(self._sock, [t.data for t in targets])
        return targets

    def forget(self, refs: list[BlockRef]) -> None:
        pass

    def close(self) -> None:
        self._sock.close()


class MemcpyDriver:
    """numpy ``copyto`` from the worker's region into the destination ring: the memory ceiling."""

    stores = False

    def __init__(self, worker: int) -> None:
        self._region = region(worker)

    def prepare(self, refs: list[BlockRef], block_size: int) -> Any:
        return [self._region[r.offset : r.offset + block_size] for r in refs]

    def put(self, request: Any, sources: Sequence[memoryview]) -> None:
        raise BenchError("memcpy has no put; use op 'copy'")

    def get(self, request: Any, targets: Sequence[np.ndarray]) -> Sequence[Any]:
        for source, target in zip(request, targets, strict=True):
            np.copyto(target, source)
        return targets

    def forget(self, refs: list[BlockRef]) -> None:
        pass

    def close(self) -> None:
        pass


def open_driver(system: str, endpoint: str, worker: int) -> Driver:
    """Connect the driver of ``system``.

    Raises:
        ValueError: an unknown system.
    """
    if system == "kvpool":
        return KvpoolDriver(endpoint)
    if system == "kvpool-shm":
        return KvpoolDriver(endpoint, transport="shm")
    if system == "kvpool-one-stream":  # bench/streams.py's baseline: every batch in one frame
        return KvpoolDriver(endpoint, streams=1)
    if system == "kvpool-wire":  # bench/single_gets.py's reference: the frames without the SDK
        return KvpoolWireDriver(endpoint)
    if system == "redis":
        return RedisDriver(endpoint)
    if system == "socket":
        return SocketDriver(endpoint, worker)
    if system == "memcpy":
        return MemcpyDriver(worker)
    if system in mooncake_peer.SYSTEMS:
        from bench.mooncake_peer.drivers import open_mooncake  # Mooncake loads only in workers that read it

        return open_mooncake(system, endpoint)
    raise ValueError(f"unknown system {system!r}")
