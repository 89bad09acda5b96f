"""The vLLM connector's staging buffers (the one staging pool): never one buffer in two hands.

A device cache's transfers take block-sized host buffers and give them back; the load and the
save lanes do so at once. A buffer handed out twice would let one transfer's bytes land in
another's block.
"""

from __future__ import annotations

import threading

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvpool_client.integrations.vllm.blocks import BlockLayers, StagingBuffers

BLOCK_NBYTES = 2 * 48  # two layers of 48 bytes a block


def layers() -> BlockLayers:
    caches = {f"layer.{i}": torch.zeros(4, 48, dtype=torch.uint8) for i in range(2)}
    return BlockLayers(caches, list(caches), 4)


class TakeAndGiveBack(RuleBasedStateMachine):
    """Takes and give-backs in any order: what is out is distinct, block-sized, and reused once back."""

    def __init__(self) -> None:
        super().__init__()
        self.staging = StagingBuffers(layers())
        self.out: list[torch.Tensor] = []
        self.back: set[int] = set()  # data pointers of the buffers given back and not taken since

    @rule(count=st.integers(0, 5))
    def take(self, count: int) -> None:
        taken = self.staging.take(count)
        assert len(taken) == count
        for buffer in taken:
            assert buffer.dtype == torch.uint8 and buffer.numel() == BLOCK_NBYTES
            assert not buffer.is_pinned(), "a host cache's staging needs no pinned memory"
        reused = {b.data_ptr() for b in taken} & self.back
        assert len(reused) == min(count, len(self.back)), "buffers given back are taken before new ones"
        self.back -= reused
        self.out.extend(taken)

    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(0, len(self.out)))
        returned, self.out = self.out[:count], self.out[count:]
        self.staging.give_back(returned)
        self.back |= {b.data_ptr() for b in returned}

    @invariant()
    def nothing_is_out_twice(self) -> None:
        pointers = [b.data_ptr() for b in self.out]
        assert len(set(pointers)) == len(pointers)
        assert not set(pointers) & self.back


TakeAndGiveBack.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_take_and_give_back = TakeAndGiveBack.TestCase


def test_threads_taking_and_giving_back_never_share_a_buffer() -> None:
    staging = StagingBuffers(layers())
    held: set[int] = set()
    lock = threading.Lock()
    shared: list[int] = []
    overwritten: list[int] = []

    def work(mark: int) -> None:
        for _ in range(300):
            buffers = staging.take(3)
            with lock:
                pointers = {b.data_ptr() for b in buffers}
                shared.extend(pointers & held)
                held.update(pointers)
            for buffer in buffers:
                buffer.fill_(mark)
            if not all(bool((b == mark).all()) for b in buffers):  # another thread wrote into one held here
                overwritten.append(mark)
            with lock:
                held.difference_update(pointers)
            staging.give_back(buffers)

    threads = [threading.Thread(target=work, args=(mark,)) for mark in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not shared and not overwritten
