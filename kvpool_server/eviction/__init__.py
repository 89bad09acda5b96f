"""Which block goes first when a tier is full."""

from collections.abc import Callable

from kvpool_server.eviction.lru import LRUPolicy
from kvpool_server.eviction.policy import EvictionPolicy
from kvpool_server.eviction.prefix import PrefixAwarePolicy

POLICIES: dict[str, Callable[[], EvictionPolicy]] = {"lru": LRUPolicy, "prefix": PrefixAwarePolicy}
"""Policy factories by config name (``eviction_policy``)."""

__all__ = ["POLICIES", "EvictionPolicy", "LRUPolicy", "PrefixAwarePolicy"]
