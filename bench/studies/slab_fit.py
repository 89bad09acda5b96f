"""What a slab size costs: which blocks fit, how much of an arena they fill, what a new size class takes.

Runs the daemon's own slab allocator (``kvpool_server.alloc.slab``, pure bookkeeping, no
memory touched), so the figures are the allocator's, not a model of it:

- per common block (a model's KV for a vLLM block, an SGLang page, an LMCache chunk):
  whether it fits in one slab, and the share of the arena blocks of that size alone fill;
- per arena size: how many slabs it has (at most that many block sizes held at once), and
  the bytes a block of a new size evicts when the arena is full (one whole slab);
- a mixed fill: blocks of several sizes written in turn until the allocator refuses one.

    .venv/bin/python -m bench.studies.slab_fit [--slabs 16MiB,64MiB] [--arena 1GiB]

Last run 2026-12-02; its results and the default ``slab_size`` they chose are in
docs/configuration.md, "Choosing `slab_size`".
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from bench.harness.comparisons import LLAMA_3_8B, QWEN2_5_0_5B, KVShape
from kvpool_server.alloc.slab import SlabAllocator

MiB, GiB = 1 << 20, 1 << 30
QWEN2_5_7B = KVShape("Qwen2.5-7B", 28, 4, 128)
QWEN2_5_32B = KVShape("Qwen2.5-32B", 64, 8, 128)
LLAMA_3_70B_TP2 = KVShape("Llama-3-70B (TP 2)", 80, 4, 128)


@dataclass(frozen=True, slots=True)
class Block:
    """One engine's block: a model's KV for ``tokens`` tokens, named by where it comes from."""

    shape: KVShape
    tokens: int
    what: str

    @property
    def nbytes(self) -> int:
        return self.shape.nbytes(self.tokens)

    def label(self) -> str:
        return f"{self.shape.name}, {self.tokens} tokens ({self.what})"


BLOCKS = (
    Block(QWEN2_5_0_5B, 32, "kvpool's demo block"),
    Block(LLAMA_3_8B, 16, "vLLM block"),
    Block(LLAMA_3_8B, 64, "SGLang page"),
    Block(QWEN2_5_7B, 256, "LMCache chunk"),
    Block(LLAMA_3_8B, 256, "LMCache chunk"),
    Block(LLAMA_3_70B_TP2, 256, "LMCache chunk"),
    Block(QWEN2_5_32B, 256, "LMCache chunk"),
)


def fill(arena: int, slab: int, sizes: Sequence[int]) -> list[int]:
    """Bytes stored of each of ``sizes``, written in turn until the allocator refuses every one.

    A refused size would evict a whole slab of another size in the daemon; here it just stops.
    """
    allocator, stored = SlabAllocator(arena, slab), [0] * len(sizes)
    open_sizes = [i for i, size in enumerate(sizes) if size <= slab]
    while open_sizes:
        for i in list(open_sizes):
            if allocator.allocate(sizes[i]) is None:
                open_sizes.remove(i)
            else:
                stored[i] += sizes[i]
    return stored


def size_arg(text: str) -> int:
    number, unit = text[:-3], text[-3:]
    return int(number) * {"MiB": MiB, "GiB": GiB}[unit]


def show(n: int) -> str:
    return f"{n / GiB:g} GiB" if n >= GiB and n % GiB == 0 else f"{n / MiB:g} MiB"


def block_table(arena: int, slabs: Sequence[int]) -> list[str]:
    head = "| block | bytes | " + " | ".join(f"{show(s)} slabs: arena filled" for s in slabs) + " |"
    rows = [head, "|---|---|" + "---|" * len(slabs)]
    for block in BLOCKS:
        cells = [f"{fill(arena, s, [block.nbytes])[0] / arena:.1%}" if block.nbytes <= s else "refused" for s in slabs]
        rows.append(f"| {block.label()} | {show(block.nbytes)} | " + " | ".join(cells) + " |")
    return rows


def mixed_cell(arena: int, slab: int, sizes: Sequence[int]) -> str:
    """``slabs; sizes held; arena filled`` for ``sizes`` written in turn."""
    if slab > arena:
        return "refused"
    stored = fill(arena, slab, sizes)
    return f"{arena // slab}; {sum(1 for b in stored if b)} of {len(sizes)}; {sum(stored) / arena:.1%}"


def arena_table(arenas: Sequence[int], slabs: Sequence[int]) -> list[str]:
    mixed = [b.nbytes for b in BLOCKS[:3]]  # three sizes every slab size takes
    head = "| arena | " + " | ".join(f"{show(s)} slabs" for s in slabs) + " |"
    rows = [head, "|---|" + "---|" * len(slabs)]
    for arena in arenas:
        rows.append(f"| {show(arena)} | " + " | ".join(mixed_cell(arena, s, mixed) for s in slabs) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slabs", default="16MiB,64MiB", help="slab sizes to compare (MiB or GiB)")
    parser.add_argument("--arena", default="1GiB", type=size_arg, help="arena of the per-block table")
    args = parser.parse_args()
    slabs = [size_arg(s) for s in args.slabs.split(",")]
    print(f"Blocks of one size in a {show(args.arena)} arena:\n")
    print("\n".join(block_table(args.arena, slabs)))
    sizes = ", ".join(show(b.nbytes) for b in BLOCKS[:3])
    print(
        f"\nBlocks of {sizes} written in turn: slabs (block sizes held at once at most); sizes that found room;"
        " arena filled\n"
    )
    print("\n".join(arena_table([64 * MiB, 128 * MiB, 256 * MiB, GiB], slabs)))


if __name__ == "__main__":
    main()
