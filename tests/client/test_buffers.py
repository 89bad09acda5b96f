"""byte_view: flat, zero-copy byte views over what engines hand the client."""

from __future__ import annotations

import array

import numpy as np
import pytest
import torch

from kvpool_client.buffers import byte_view
from kvpool_client.core.errors import ErrorCode, UsageError


def assert_flat_bytes(view: memoryview, expected: bytes) -> None:
    assert (view.format, view.ndim, view.itemsize) == ("B", 1, 1), (view.format, view.ndim, view.itemsize)
    assert bytes(view) == expected, (bytes(view)[:32], expected[:32])


# -- Python buffers -------------------------------------------------------------------


def test_bytes_is_a_read_only_source() -> None:
    view = byte_view(b"hello", writable=False)
    assert_flat_bytes(view, b"hello")
    assert view.readonly
    with pytest.raises(UsageError, match="read-only") as raised:
        byte_view(b"hello", writable=True)
    assert raised.value.code is ErrorCode.INVALID_ARGUMENT


def test_bytearray_view_writes_through() -> None:
    buf = bytearray(b"abcdef")
    view = byte_view(buf, writable=True)
    view[1:3] = b"XY"
    assert buf == bytearray(b"aXYdef"), buf
    buf[0] = ord("z")
    assert view[0] == ord("z")


def test_memoryview_multi_dimensional_is_flattened_in_c_order() -> None:
    raw = bytearray(range(24))
    cube = memoryview(raw).cast("B", [2, 3, 4])
    view = byte_view(cube, writable=True)
    assert_flat_bytes(view, bytes(range(24)))
    view[23] = 0xFF
    assert raw[23] == 0xFF


@pytest.mark.parametrize("code", ["h", "i", "d", "f", "q"])
def test_memoryview_of_typed_items_counts_bytes(code: str) -> None:
    arr = array.array(code, [1, 2, 3])
    view = byte_view(memoryview(arr), writable=True)
    assert_flat_bytes(view, arr.tobytes())
    assert len(view) == 3 * arr.itemsize
    view[: arr.itemsize] = array.array(code, [9]).tobytes()
    assert arr[0] == 9, arr


def test_a_sliced_memoryview_keeps_its_offset() -> None:
    raw = bytearray(b"0123456789")
    view = byte_view(memoryview(raw)[3:7], writable=True)
    assert_flat_bytes(view, b"3456")
    view[:] = b"abcd"
    assert raw == bytearray(b"012abcd789"), raw


def test_strided_memoryview_is_refused() -> None:
    with pytest.raises(UsageError, match="contiguous"):
        byte_view(memoryview(bytearray(10))[::2], writable=False)


def test_read_only_memoryview_as_destination_is_refused() -> None:
    with pytest.raises(UsageError, match="read-only"):
        byte_view(memoryview(bytearray(4)).toreadonly(), writable=True)


@pytest.mark.parametrize("obj", [42, "text", [1, 2], None, object()])
def test_objects_without_a_buffer_are_refused(obj: object) -> None:
    with pytest.raises(UsageError, match="does not expose a buffer"):
        byte_view(obj, writable=False)


# -- numpy ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16, np.float32, np.int64, np.dtype(">i4")])
def test_numpy_arrays_share_memory(dtype: np.dtype) -> None:
    arr = np.arange(12, dtype=dtype).reshape(3, 4)
    view = byte_view(arr, writable=True)
    assert_flat_bytes(view, arr.tobytes())
    assert len(view) == arr.nbytes
    view[: arr.itemsize] = np.array([99], dtype=dtype).tobytes()
    assert arr[0, 0] == 99, arr


def test_numpy_row_slice_is_contiguous_and_offset() -> None:
    arr = np.zeros((4, 4), dtype=np.uint8)
    view = byte_view(arr[1:3], writable=True)
    view[:] = b"\x01" * 8
    assert arr.sum() == 8 and arr[1:3].all() and not arr[0].any() and not arr[3].any(), arr


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: np.zeros((4, 4), dtype=np.float32)[:, ::2], id="column-stride"),
        pytest.param(lambda: np.zeros((4, 6), dtype=np.float32).T, id="fortran-order"),
        pytest.param(lambda: np.zeros(10, dtype=np.uint8)[::3], id="step"),
    ],
)
def test_non_contiguous_numpy_is_refused(make) -> None:
    with pytest.raises(UsageError, match="contiguous"):
        byte_view(make(), writable=False)


def test_read_only_numpy_is_a_source_but_not_a_destination() -> None:
    arr = np.arange(4, dtype=np.int32)
    arr.flags.writeable = False
    assert_flat_bytes(byte_view(arr, writable=False), arr.tobytes())
    with pytest.raises(UsageError, match="read-only"):
        byte_view(arr, writable=True)


def test_numpy_scalar_array() -> None:
    arr = np.array(1.5, dtype=np.float64)
    assert_flat_bytes(byte_view(arr, writable=True), arr.tobytes())


def test_empty_multi_dimensional_numpy() -> None:
    try:
        view = byte_view(np.zeros((0, 4), dtype=np.float32), writable=True)
    except UsageError:
        return
    assert len(view) == 0


def test_numpy_without_buffer_support_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        byte_view(np.zeros(2, dtype="datetime64[s]"), writable=False)


# -- torch ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int8, torch.float32, torch.bool])
def test_torch_tensors_share_memory(dtype: torch.dtype) -> None:
    tensor = torch.zeros(2, 3, 4, dtype=dtype)
    view = byte_view(tensor, writable=True)
    nbytes = tensor.numel() * tensor.element_size()
    assert_flat_bytes(view, bytes(nbytes))
    one = torch.ones(1, dtype=dtype).view(torch.uint8).numpy().tobytes()
    view[: len(one)] = one  # write through the view ...
    assert tensor.flatten()[0].item() == 1, tensor.flatten()[:4]
    tensor[-1, -1, -1] = 1  # ... and through the tensor
    assert bytes(view[-len(one) :]) == one


def test_bfloat16_bytes_are_the_tensors_bytes() -> None:
    tensor = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    view = byte_view(tensor, writable=False)
    assert_flat_bytes(view, tensor.view(torch.uint8).numpy().tobytes())
    assert bytes(view[:2]) == b"\xc0\x3f", "bfloat16 1.5 is 0x3FC0, little endian"


def test_torch_row_slice_keeps_its_storage_offset() -> None:
    tensor = torch.zeros(4, 4, dtype=torch.int8)
    byte_view(tensor[1:3], writable=True)[:] = b"\x07" * 8
    assert tensor[1:3].eq(7).all() and tensor[0].eq(0).all() and tensor[3].eq(0).all(), tensor


def test_torch_scalar_and_empty_tensors() -> None:
    scalar = torch.tensor(2.0, dtype=torch.float32)
    assert_flat_bytes(byte_view(scalar, writable=True), scalar.numpy().tobytes())
    assert len(byte_view(torch.zeros(0, 8, dtype=torch.float16), writable=True)) == 0


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: torch.zeros(4, 6).T, id="transpose"),
        pytest.param(lambda: torch.zeros(4, 6)[:, ::2], id="column-stride"),
        pytest.param(lambda: torch.zeros(2, 3, 4, dtype=torch.float16).permute(2, 0, 1), id="permute"),
        pytest.param(lambda: torch.zeros(4, 4).expand(3, 4, 4), id="broadcast"),
    ],
)
@pytest.mark.parametrize("writable", [False, True])
def test_non_contiguous_tensors_are_refused(make, writable: bool) -> None:
    with pytest.raises(UsageError, match="contiguous") as raised:
        byte_view(make(), writable=writable)
    assert raised.value.code is ErrorCode.INVALID_ARGUMENT


def test_a_tensor_that_requires_grad_is_a_source_but_not_a_destination() -> None:
    tensor = torch.ones(4, requires_grad=True)
    assert_flat_bytes(byte_view(tensor, writable=False), torch.ones(4).numpy().tobytes())
    with pytest.raises(UsageError, match="requires grad"):
        byte_view(tensor, writable=True)


def test_a_tensor_off_the_cpu_is_refused() -> None:
    with pytest.raises(UsageError, match="meta"):
        byte_view(torch.empty(4, device="meta"), writable=False)
