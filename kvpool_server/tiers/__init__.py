"""Storage tiers of a daemon: DRAM now, SSD below it."""
