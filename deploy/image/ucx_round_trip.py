"""Put and read back blocks over UCX against one daemon; prints its ucx endpoint and the transport used.

Usage: python ucx_round_trip.py HOST:GRPC_PORT (or ``python - HOST:GRPC_PORT < ucx_round_trip.py``
inside the image). Used by deploy/image/smoke.sh and tests/deploy; exits non-zero on any mismatch.
"""

import sys

from kvpool_client.client import KVPoolClient
from kvpool_client.core.config import ClientConfig
from kvpool_client.core.keys import BlockKey

address = sys.argv[1]
pool = KVPoolClient(config=ClientConfig(nodes=(address,), transport="ucx", request_timeout_s=20.0))
keys = [BlockKey("deploy-ucx", bytes([i]) * 16) for i in range(4)]
blocks = [bytes([i]) * (256 << 10) for i in range(4)]
statuses = pool.put(keys, blocks).statuses
assert all(s.name in ("OK", "ALREADY_EXISTS") for s in statuses), statuses
got = pool.get(keys)
assert got.ok and [bytes(b) for b in got.buffers] == blocks, got.statuses
print(pool.server_info(address).data_endpoints["ucx"], pool.transport(address))
pool.close()
