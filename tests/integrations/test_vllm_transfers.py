"""The vLLM connector's worker side against a real daemon: copy order, threads, and what it reports.

The KV cache is a real layer-major tensor set in host memory (copied through staging buffers,
as a GPU cache is); the order of copies is checked on a recording double of CUDA's stream and
event API (tests/support/cuda_streams.py), since no GPU is here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import torch

from kvpool_client import BlockKey, KVPoolClient
from kvpool_client.integrations.vllm.blocks import BlockLayers
from kvpool_client.integrations.vllm.scheduler import StepPlan, TransferJob
from kvpool_client.integrations.vllm.shape import CacheShape
from kvpool_client.integrations.vllm.streams import CudaOrder, HostOrder
from kvpool_client.integrations.vllm.worker import WorkerTransfers
from tests.support.cuda_streams import Call, RecordingCuda
from tests.support.daemon import DaemonProcess

NAMESPACES = CacheShape("m", "bfloat16", "NHD", "mha", 2, 2, 8, 4, tp_size=2).namespaces()
BLOCKS = 8


class NotedLayers(BlockLayers):
    """The real cache view, copied through staging buffers as a GPU cache is, noting each copy on
    the recording double (the stream it is issued on)."""

    def __init__(self, cuda: RecordingCuda, device_memory: bool = True) -> None:
        caches = {f"l{i}": torch.zeros(2, BLOCKS, 4, 2, 8, dtype=torch.bfloat16) for i in range(2)}  # K/V outermost
        super().__init__(caches, list(caches), BLOCKS)
        self.host_memory = not device_memory
        self._cuda = cuda

    def gather(self, block_id: int, out: torch.Tensor) -> None:
        self._cuda.note("gather")
        super().gather(block_id, out)

    def scatter(self, block_id: int, src: torch.Tensor) -> None:
        self._cuda.note("scatter")
        super().scatter(block_id, src)


def job(req_id: str, block_ids: tuple[int, ...], seed: int = 0) -> TransferJob:
    hashes = tuple(bytes([seed, i]) * 16 for i in range(len(block_ids)))
    return TransferJob(req_id, hashes, 0, block_ids, NAMESPACES)


def pool_keys(j: TransferJob, tp_rank: int = 0) -> list[BlockKey]:
    return [BlockKey(NAMESPACES.of(tp_rank, 0).id, h) for h in j.hashes]


def until(condition: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.002)


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[KVPoolClient]:
    with KVPoolClient([daemon.address]) as pool:
        yield pool


@pytest.fixture
def gpu(client: KVPoolClient) -> Iterator[tuple[WorkerTransfers, RecordingCuda, NotedLayers]]:
    """Transfers of rank 0 as on a GPU: staging copies ordered by CudaOrder over the recording double."""
    cuda = RecordingCuda()
    layers = NotedLayers(cuda)
    transfers = WorkerTransfers(client, layers, CudaOrder(torch.device("cuda", 0), cuda))
    yield transfers, cuda, layers
    for released in cuda._held.values():
        released.set()
    transfers.close()


def fill(layers: BlockLayers, block_id: int, value: int) -> torch.Tensor:
    data = torch.full((layers.block_nbytes,), value, dtype=torch.uint8)
    layers.scatter(block_id, data)
    return data


def calls(cuda: RecordingCuda, thread_prefix: str) -> list[Call]:
    return [c for c in cuda.log if c.thread.startswith(thread_prefix)]


def test_a_save_copies_after_the_forward_pass_and_is_sent_after_its_copies_end(
    gpu: tuple[WorkerTransfers, RecordingCuda, NotedLayers], client: KVPoolClient
) -> None:
    transfers, cuda, layers = gpu
    saved = job("a", (1, 2))
    want = [fill(layers, b, 10 + b) for b in saved.block_ids]
    plan = StepPlan(saves=[saved])
    device_busy = cuda.hold("kvpool-save")
    forward = cuda.Stream(name="forward")
    with cuda.stream(forward):  # vLLM's model runner runs the step on a stream of its own
        transfers.begin_step(plan)
        transfers.start_saves(plan)  # wait_for_save: the forward pass is launched, maybe not done
    cuda.wait_for("synchronize")
    assert client.exists(pool_keys(saved)) == [False, False], "bytes left before the device copy ended"
    device_busy.set()
    until(lambda: all(client.exists(pool_keys(saved))), "the save")

    (marked,) = [c for c in cuda.log if c.what == "record"]
    assert (marked.stream, marked.thread) == ("forward", "MainThread"), "marked on vLLM's stream, when it called"
    copy = calls(cuda, "kvpool-save")
    assert copy[0].what == "wait_event" and copy[0].event == marked.event and copy[0].stream != "forward"
    assert [c.what for c in copy[1:]] == ["gather", "gather", "synchronize"], copy
    assert {c.stream for c in copy} == {copy[0].stream}, "every copy on the stream that waited"
    result = client.get(pool_keys(saved))
    assert [bytes(b or b"") for b in result.buffers] == [w.numpy().tobytes() for w in want]


def test_a_load_writes_after_the_step_work_and_is_reported_after_its_copies_end(
    gpu: tuple[WorkerTransfers, RecordingCuda, NotedLayers], client: KVPoolClient
) -> None:
    transfers, cuda, layers = gpu
    loaded = job("a", (3, 4), seed=1)
    blocks = [bytes([20 + i]) * layers.block_nbytes for i in range(2)]
    assert client.put(pool_keys(loaded), blocks).stored == 2
    device_busy = cuda.hold("kvpool-load")
    with cuda.stream(cuda.Stream(name="forward")):  # vLLM may still be zeroing the new blocks on it
        transfers.begin_step(StepPlan(loads=[loaded]))
    cuda.wait_for("synchronize")
    assert transfers.finished() == (None, None), "a load is reported only once its copies ended"
    device_busy.set()
    until(lambda: transfers.finished()[1] == {"a"}, "the load's report")

    (marked,) = [c for c in cuda.log if c.what == "record"]
    assert marked.stream == "forward"
    copy = calls(cuda, "kvpool-load")
    assert copy[0].what == "wait_event" and copy[0].event == marked.event
    assert [c.what for c in copy[1:]] == ["scatter", "scatter", "synchronize"], copy
    out = torch.empty(layers.block_nbytes, dtype=torch.uint8)
    for block_id, want in zip(loaded.block_ids, blocks, strict=True):
        layers.gather(block_id, out)
        assert out.numpy().tobytes() == want, f"block {block_id}"
    assert transfers.load_errors() == set()


def test_a_load_does_not_wait_behind_saves(
    gpu: tuple[WorkerTransfers, RecordingCuda, NotedLayers], client: KVPoolClient
) -> None:
    transfers, cuda, layers = gpu
    loaded = job("l", (5,), seed=2)
    client.put(pool_keys(loaded), [bytes(layers.block_nbytes)])
    device_busy = cuda.hold("kvpool-save")  # a long prefill's saves hold their thread
    saves = StepPlan(saves=[job("s", (1, 2, 3), seed=3)])
    transfers.begin_step(saves)
    transfers.start_saves(saves)
    cuda.wait_for("synchronize")
    transfers.begin_step(StepPlan(loads=[loaded]))
    until(lambda: transfers.finished()[1] == {"l"}, "the load, while the saves still run")
    device_busy.set()


@pytest.mark.parametrize("deferred", [False, True], ids=["wait_for_save-first", "get_finished-first"])
def test_a_finished_request_is_reported_once_after_its_saves_in_either_call_order(
    client: KVPoolClient, deferred: bool
) -> None:
    layers = NotedLayers(RecordingCuda())
    transfers = WorkerTransfers(client, layers, HostOrder())
    try:
        last = StepPlan(saves=[job("a", (1, 2), seed=4)], finishing=frozenset({"a"}))  # its final saves
        transfers.begin_step(last)
        if deferred:  # speculative decoding: get_finished before wait_for_save
            assert transfers.finished() == (None, None), "its saves are not even handed over yet"
        transfers.start_saves(last)
        reported: set[str] = set()
        for _ in range(1000):  # the following steps, until the worker reports it
            transfers.begin_step(StepPlan())
            reported |= transfers.finished()[0] or set()
            if reported:
                break
            time.sleep(0.005)
        assert reported == {"a"}, "a request held for its saves must be reported, or its blocks leak"
        assert all(client.exists(pool_keys(last.saves[0]))), "reported only after its blocks were stored"
        transfers.begin_step(StepPlan())
        assert transfers.finished() == (None, None), "reported once"
    finally:
        transfers.close()


def test_each_rank_stores_its_own_shard_under_its_own_namespace(client: KVPoolClient) -> None:
    layers = NotedLayers(RecordingCuda())
    fill(layers, 1, 77)
    transfers = WorkerTransfers(client, layers, HostOrder(), tp_rank=1)
    saved = job("a", (1,), seed=5)
    try:
        transfers.begin_step(StepPlan(saves=[saved]))
        transfers.start_saves(StepPlan(saves=[saved]))
        transfers.wait_for(["a"])
    finally:
        transfers.close()
    assert client.exists(pool_keys(saved, tp_rank=1)) == [True]
    assert client.exists(pool_keys(saved, tp_rank=0)) == [False], "rank 1's shard is not rank 0's block"
