"""Memory for blocks: the shared-memory arena and the slab allocator that carves it."""
