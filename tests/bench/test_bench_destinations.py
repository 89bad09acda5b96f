"""The block benchmark's destinations at offsets from a page: where they lie, which cells use them, their report."""

from __future__ import annotations

from bench.blocks import CLIENTS, plan_cells
from bench.harness import report
from bench.harness.cells import Cell
from bench.harness.workload import CellSpec, TargetRing, page_aligned, region

KiB = 1 << 10
PAGE = 4096


def spec(dest_offset: int, block: int = 64 * KiB, batch: int = 4) -> CellSpec:
    return CellSpec("memcpy", "copy", block, batch, 1, "", 0.1, b"t" * 8, None, dest_offset)


def test_every_destination_of_a_burst_lies_its_offset_past_a_page() -> None:
    ring = TargetRing()
    for offset in (0, 16, 64):
        slots = ring.slots(spec(offset), burst=1)
        starts = {int(view.ctypes.data) % PAGE for op in slots for view in op}
        assert starts == {offset}, f"page+{offset}: destinations start at {starts} past a page"
        assert all(view.nbytes == 64 * KiB for op in slots for view in op)


def test_the_blocks_source_region_is_page_aligned() -> None:
    assert int(region(0).ctypes.data) % PAGE == 0
    assert int(page_aligned(PAGE + 1).ctypes.data) % PAGE == 0


def test_offsets_add_one_client_reads_only_right_after_their_aligned_cell() -> None:
    specs = plan_cells({}, ["memcpy", "kvpool"], 0.1, (0, 16, 64))
    shifted = [s for s in specs if s.dest_offset]
    assert shifted and all(s.op in ("get", "copy") and s.clients == 1 for s in shifted), shifted
    aligned_reads = [s for s in specs if s.op in ("get", "copy") and s.clients == 1 and not s.dest_offset]
    assert len(shifted) == 2 * len(aligned_reads)
    first = specs.index(shifted[0])
    before = specs[first - 1]
    assert (before.system, before.op, before.block_size, before.batch, before.dest_offset) == (
        shifted[0].system,
        shifted[0].op,
        shifted[0].block_size,
        shifted[0].batch,
        0,
    )
    assert len({s.tag for s in specs}) == len(specs), "two cells share a tag (and so keys)"
    assert len(plan_cells({}, ["memcpy"], 0.1)) == len(CLIENTS) * 3 * 2, "without offsets: the cells of before"


def test_ratios_read_page_aligned_cells_and_the_report_names_each_destination() -> None:
    def cell(offset: int, gbps: float) -> Cell:
        return Cell("kvpool-shm", "get", report.RATIO_BLOCK, 1, 1, gbps=gbps, ops_per_s=1.0, dest_offset=offset)

    cells = [cell(16, 2.0), cell(0, 8.0), cell(64, 6.0)]
    assert report.find(cells, "kvpool-shm", "get", report.RATIO_BLOCK, 1, 1).gbps == 8.0
    lines = report.alignment_lines(cells)
    expected = "- kvpool-shm get 384 KiB x1 c1: page+0 8.00, page+16 2.00 (0.25x), page+64 6.00 (0.75x) GB/s"
    assert lines == expected, lines
    table = report.markdown_table(cells)
    assert [row.split(" | ")[5] for row in table.splitlines()[2:]] == ["page+0", "page+16", "page+64"], table
