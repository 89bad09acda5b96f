from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListTenantsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TenantUsage(_message.Message):
    __slots__ = ("tenant", "namespaces", "rights", "dram_bytes", "ssd_bytes", "dram_quota", "ssd_quota", "connections", "connection_cap")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    RIGHTS_FIELD_NUMBER: _ClassVar[int]
    DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    SSD_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAM_QUOTA_FIELD_NUMBER: _ClassVar[int]
    SSD_QUOTA_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_CAP_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    rights: _containers.RepeatedScalarFieldContainer[str]
    dram_bytes: int
    ssd_bytes: int
    dram_quota: int
    ssd_quota: int
    connections: int
    connection_cap: int
    def __init__(self, tenant: _Optional[str] = ..., namespaces: _Optional[_Iterable[str]] = ..., rights: _Optional[_Iterable[str]] = ..., dram_bytes: _Optional[int] = ..., ssd_bytes: _Optional[int] = ..., dram_quota: _Optional[int] = ..., ssd_quota: _Optional[int] = ..., connections: _Optional[int] = ..., connection_cap: _Optional[int] = ...) -> None: ...

class TenantList(_message.Message):
    __slots__ = ("tenants",)
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantUsage]
    def __init__(self, tenants: _Optional[_Iterable[_Union[TenantUsage, _Mapping]]] = ...) -> None: ...

class FlushNamespaceRequest(_message.Message):
    __slots__ = ("namespace", "model")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    model: str
    def __init__(self, namespace: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class ListNamespacesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NamespaceUsage(_message.Message):
    __slots__ = ("namespace", "tier", "blocks", "bytes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    tier: str
    blocks: int
    bytes: int
    def __init__(self, namespace: _Optional[str] = ..., tier: _Optional[str] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class NamespaceList(_message.Message):
    __slots__ = ("namespaces",)
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    namespaces: _containers.RepeatedCompositeFieldContainer[NamespaceUsage]
    def __init__(self, namespaces: _Optional[_Iterable[_Union[NamespaceUsage, _Mapping]]] = ...) -> None: ...

class FlushNamespaceResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class SetStateRequest(_message.Message):
    __slots__ = ("state", "handoff")
    STATE_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_FIELD_NUMBER: _ClassVar[int]
    state: str
    handoff: bool
    def __init__(self, state: _Optional[str] = ..., handoff: bool = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DataEndpoint(_message.Message):
    __slots__ = ("transport", "address")
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    transport: str
    address: str
    def __init__(self, transport: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class SharedArena(_message.Message):
    __slots__ = ("arena_path", "generations_offset", "arena_id", "capacity_bytes", "verify_checksums", "index_offset", "hit_marks_path")
    ARENA_PATH_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ARENA_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERIFY_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    INDEX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIT_MARKS_PATH_FIELD_NUMBER: _ClassVar[int]
    arena_path: str
    generations_offset: int
    arena_id: int
    capacity_bytes: int
    verify_checksums: bool
    index_offset: int
    hit_marks_path: str
    def __init__(self, arena_path: _Optional[str] = ..., generations_offset: _Optional[int] = ..., arena_id: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., verify_checksums: bool = ..., index_offset: _Optional[int] = ..., hit_marks_path: _Optional[str] = ...) -> None: ...

class WireLimits(_message.Message):
    __slots__ = ("max_keys", "max_block_size", "max_payload")
    MAX_KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    max_keys: int
    max_block_size: int
    max_payload: int
    def __init__(self, max_keys: _Optional[int] = ..., max_block_size: _Optional[int] = ..., max_payload: _Optional[int] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("node_id", "version", "protocol_version", "endpoints", "dram_capacity_bytes", "slab_size", "limits", "state", "started_at_unix_s", "ssd_capacity_bytes", "shared_arena", "metrics_url")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    DRAM_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SSD_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARED_ARENA_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    version: str
    protocol_version: int
    endpoints: _containers.RepeatedCompositeFieldContainer[DataEndpoint]
    dram_capacity_bytes: int
    slab_size: int
    limits: WireLimits
    state: str
    started_at_unix_s: float
    ssd_capacity_bytes: int
    shared_arena: SharedArena
    metrics_url: str
    def __init__(self, node_id: _Optional[str] = ..., version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[DataEndpoint, _Mapping]]] = ..., dram_capacity_bytes: _Optional[int] = ..., slab_size: _Optional[int] = ..., limits: _Optional[_Union[WireLimits, _Mapping]] = ..., state: _Optional[str] = ..., started_at_unix_s: _Optional[float] = ..., ssd_capacity_bytes: _Optional[int] = ..., shared_arena: _Optional[_Union[SharedArena, _Mapping]] = ..., metrics_url: _Optional[str] = ...) -> None: ...

class KeysRequest(_message.Message):
    __slots__ = ("namespace", "hashes")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, namespace: _Optional[str] = ..., hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ExistsResponse(_message.Message):
    __slots__ = ("present",)
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, present: _Optional[_Iterable[bool]] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("prefix_hits",)
    PREFIX_HITS_FIELD_NUMBER: _ClassVar[int]
    prefix_hits: int
    def __init__(self, prefix_hits: _Optional[int] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, deleted: _Optional[_Iterable[bool]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("name", "capacity_bytes", "used_bytes", "blocks", "hits", "misses", "evictions", "promotions", "demotions", "corrupt_blocks", "io_errors", "failure")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_FIELD_NUMBER: _ClassVar[int]
    DEMOTIONS_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    IO_ERRORS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    name: str
    capacity_bytes: int
    used_bytes: int
    blocks: int
    hits: int
    misses: int
    evictions: int
    promotions: int
    demotions: int
    corrupt_blocks: int
    io_errors: int
    failure: str
    def __init__(self, name: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., blocks: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., evictions: _Optional[int] = ..., promotions: _Optional[int] = ..., demotions: _Optional[int] = ..., corrupt_blocks: _Optional[int] = ..., io_errors: _Optional[int] = ..., failure: _Optional[str] = ...) -> None: ...

class Stats(_message.Message):
    __slots__ = ("node_id", "uptime_s", "tiers", "counters")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    uptime_s: float
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    counters: _containers.ScalarMap[str, int]
    def __init__(self, node_id: _Optional[str] = ..., uptime_s: _Optional[float] = ..., tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., counters: _Optional[_Mapping[str, int]] = ...) -> None: ...
