"""The data plane: block bytes between clients and the arena."""
