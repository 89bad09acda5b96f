# The compiled reader of a published index (_arena_reader.c): a same-node client's reads (read; its Python
# twin is kvpool_client.transport.shm), and the daemon's sends of its own published blocks (locate, send).

class ArenaReader:
    def __init__(
        self,
        table: memoryview,
        generations: memoryview,
        arena: memoryview,
        marks: memoryview,
        entries: int,
        probe_limit: int,
        granule: int,
        mark_first: int,
        mark_shift: int,
        vector_near: bool,
    ) -> None: ...
    def read(
        self, low: int, high: int, target: memoryview | tuple[memoryview, ...], tick: int, /
    ) -> tuple[int, int, int, int, int, bool] | None: ...
    def locate(self, low: int, high: int, tick: int, /) -> tuple[int, int, int, int] | None: ...
    def send(self, fd: int, head: bytes, offset: int, length: int, generation: int, /) -> bytes | None: ...
    def release(self) -> None: ...
