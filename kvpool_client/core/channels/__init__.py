"""Channels that move a connection's bytes: TCP, TLS and UCX, for the daemon and the clients."""
