"""The exchange each op's job is built into (kvpool_client/request_factory.py)."""

from __future__ import annotations

from kvpool_client.batching import Job
from kvpool_client.core.routing import Member
from kvpool_client.core.wire import DeleteRequest, ExistsRequest, GetRequest, PutRequest, WireLimits, encode
from kvpool_client.exchange import Send
from kvpool_client.request_factory import RequestFactory

A = Member("a", "a:7000")
NS1 = "m1@fp16@L@tp0of1"


def test_request_factory_builds_each_op_with_fresh_ids() -> None:
    factory = RequestFactory(verify_checksums=True)
    job = Job(A, NS1, [2, 0], [b"h2" * 16, b"h0" * 16], [None, None])
    views = [memoryview(b"zero"), memoryview(b"one"), memoryview(b"two!!")]
    limits = WireLimits()
    put = factory.put(job, views, limits)
    first = next(put)
    assert isinstance(first, Send), first
    assert first.buffers == [encode(PutRequest(1, NS1, job.hashes, [5, 4])), views[2], views[0]], first.buffers
    get = next(factory.get(job, [None, None, None], limits))
    assert get == Send([encode(GetRequest(2, NS1, job.hashes))]), get
    exists = next(factory.exists(job, limits, prefix=True))
    assert exists == Send([encode(ExistsRequest(3, NS1, job.hashes, prefix=True))]), exists
    delete = next(factory.delete(job, limits))
    assert delete == Send([encode(DeleteRequest(4, NS1, job.hashes))]), delete
