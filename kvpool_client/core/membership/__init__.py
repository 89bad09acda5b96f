"""Cluster membership in etcd: node records, the cluster config, and a live view of both.

- :mod:`.records`: what lives in etcd (``NodeRecord``, ``ClusterConfig``) and the key layout.
- :mod:`.etcd`: ``EtcdStore``, the only module that talks to the etcd client library.
- :mod:`.view`: ``MembershipView`` (asyncio) and ``ThreadedMembershipView`` (blocking callers).
- :mod:`.cluster`: one-shot reads and config updates, for tools such as kvpoolctl.

The daemon side (lease, keepalive, re-registration) is ``kvpool_server.membership``.
Importing this package does not import the etcd client library.
"""
