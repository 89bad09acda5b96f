"""Which block goes first when a tier is full."""

from kvpool_server.eviction.lru import LRUPolicy
from kvpool_server.eviction.policy import EvictionPolicy

__all__ = ["EvictionPolicy", "LRUPolicy"]
