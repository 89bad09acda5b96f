"""The protocol core that the daemon and the clients share.

Everything both ends must agree on lives here, and nothing here imports the rest of
the SDK or the daemon (``tests/packages/test_import_boundaries.py`` holds that):

- ``wire/``: the data-plane protocol, sans-IO (frames, codec, connection state machines)
  and the layouts same-node readers share with the daemon;
- ``channels/``: the byte-moving channels (TCP, TLS, UCX, scatter/gather I/O, copies);
- ``proto/``, ``control.py``: the gRPC control plane and its error mapping;
- ``membership/``: etcd, node and cluster records, the live membership view;
- ``routing.py``: placement of blocks on nodes; ``keys.py``: block keys;
- ``errors.py``, ``auth.py``, ``config.py``, ``settings/``, ``version.py``.

It lives inside ``kvpool_client`` because engines install only the client, and the
daemon depends on the client package anyway; ``kvpool_client/__init__`` exports
lazily, so importing ``kvpool_client.core.wire`` loads neither client.
"""
