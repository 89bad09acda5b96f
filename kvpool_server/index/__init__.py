"""What a daemon knows about each block it holds."""

from kvpool_server.index.entry import BlockEntry, BlockStatus, StoreKey

__all__ = ["BlockEntry", "BlockStatus", "StoreKey"]
