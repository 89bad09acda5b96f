"""The block benchmarks' kvpool drivers against a real daemon: what each reads back is what was put."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bench.harness.drivers import BenchError, open_driver
from bench.harness.workload import BlockRef
from tests.support.daemon import DaemonProcess

BLOCK = 64 << 10


@pytest.mark.parametrize("system", ["kvpool", "kvpool-one-stream", "kvpool-wire"])
def test_a_driver_reads_back_the_blocks_it_put(daemon: DaemonProcess, system: str) -> None:
    driver = open_driver(system, daemon.address, 0)
    try:
        refs = [BlockRef(os.urandom(16), 0) for _ in range(3)]
        request = driver.prepare(refs, BLOCK)
        blocks = [np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8) for i in range(3)]
        driver.put(request, [b.data for b in blocks])
        for i in range(3):  # one key a get: kvpool-wire reads no batches
            target = np.zeros(BLOCK, dtype=np.uint8)
            driver.get(request[i : i + 1], [target])
            assert np.array_equal(target, blocks[i]), f"{system}: block {i} came back wrong"
        with pytest.raises(BenchError):
            driver.get(request[:1], [np.zeros(BLOCK // 2, dtype=np.uint8)])  # not the block's size
        target = np.zeros(BLOCK, dtype=np.uint8)
        driver.get(request[2:], [target])  # the failed get left nothing behind for this one to read
        assert np.array_equal(target, blocks[2]), f"{system}: a get after a failed one came back wrong"
        driver.forget(refs)
    finally:
        driver.close()
