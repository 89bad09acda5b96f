"""The gRPC control plane: info, lookups, deletes, stats, health."""
