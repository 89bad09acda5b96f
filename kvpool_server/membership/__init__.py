"""The daemon's side of cluster membership: registering in etcd under a lease."""
