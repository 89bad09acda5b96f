# The compiled same-node reader (_arena_reader.c); kvpool_client.transport.shm holds its Python twin.

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
        self, low: int, high: int, target: memoryview, tick: int, /
    ) -> tuple[int, int, int, int, int, bool] | None: ...
    def release(self) -> None: ...
