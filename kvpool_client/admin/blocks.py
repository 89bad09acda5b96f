"""``put``, ``get``, ``rm`` and ``lookup``: blocks through the client SDK.

Before touching a block we ask its owner for its ServerInfo, so a node that is
down is reported by address (exit 3) instead of as a miss.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kvpool_client.admin import format as fmt
from kvpool_client.admin.exits import CliError, ExitCode, from_status, unreachable
from kvpool_client.admin.inputs import name_key, read_bytes, read_tokens, write_bytes
from kvpool_client.admin.session import open_session
from kvpool_client.client import KVPoolClient
from kvpool_client.core.config import ClientConfig
from kvpool_client.core.control import NodeInfo
from kvpool_client.core.errors import ErrorCode, NodeUnavailable, RequestTimeout, UsageError
from kvpool_client.core.keys import BlockKey, BlockKeyBuilder, Namespace
from kvpool_client.core.membership.records import ClusterConfig
from kvpool_client.core.routing import Member, RendezvousRouter, StaticRouter

# A put that finds the block already stored (or being stored) leaves it in the pool.
_PUT_OK = frozenset({ErrorCode.OK, ErrorCode.ALREADY_EXISTS, ErrorCode.BUSY})


class _Pool:
    """A client plus the router it places keys with, so we know each key's node.

    With ``--etcd`` the router places over the cluster's records with its replica
    count, as every client of the cluster does; else over the ``--nodes`` list.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.router = _etcd_router(args) if args.etcd else StaticRouter(args.nodes)
        config = ClientConfig(
            nodes=tuple(m.address for m in self.router.members()),
            request_timeout_s=args.timeout,
            connect_timeout_s=min(args.timeout, 3.0),
            auth_token=args.credentials.token,
            tls=args.credentials.tls,
        )
        self.client = KVPoolClient(config=config, router=self.router)

    def owner(self, key: BlockKey) -> str:
        """The first node a put writes to (or, with no active owner, a get reads from)."""
        placement = self.router.placement(key)
        owners = placement.write_owners or placement.read_order
        if not owners:
            raise CliError(ExitCode.UNREACHABLE, f"no active node holds {key}: run `kvpoolctl status`")
        return owners[0].address

    def reach(self, addresses: Iterable[str]) -> dict[str, NodeInfo]:
        """ServerInfo of each address (the client caches it for the data plane).

        Raises:
            CliError: UNREACHABLE for the first node that does not answer.
        """
        infos = {}
        for address in dict.fromkeys(addresses):
            try:
                infos[address] = self.client.server_info(address)
            except (NodeUnavailable, RequestTimeout) as exc:
                raise unreachable(address, exc) from None
        return infos


def _etcd_router(args: argparse.Namespace) -> RendezvousRouter:
    """Placement over the nodes registered in etcd, with the cluster's replica count."""
    with open_session(args, args.command) as session:
        listing = session.nodes()
        config = session.config() or ClusterConfig()
    if not listing.nodes:
        raise CliError(
            ExitCode.UNREACHABLE,
            f"no nodes registered in cluster {args.cluster!r}: start kvpool-server with --etcd-endpoints",
        )
    members = [
        Member(
            node_id=r.node_id,
            address=r.address,
            weight=r.weight,
            state=r.state,
            data_address=r.data_endpoints.get("tcp", ""),
        )
        for r in listing.nodes.values()
    ]
    return RendezvousRouter(members, config.replicas)


@contextmanager
def _pool(args: argparse.Namespace) -> Iterator[_Pool]:
    pool = _Pool(args)
    try:
        yield pool
    finally:
        pool.client.close()


def _key(args: argparse.Namespace) -> BlockKey:
    digest = args.key if args.key is not None else name_key(args.name)
    try:
        return BlockKey(args.namespace, digest)
    except UsageError as exc:
        raise CliError(ExitCode.USAGE, f"fix --namespace: {exc.args[0]}") from None


def run_put(args: argparse.Namespace) -> ExitCode:
    """Store the bytes of ``args.file`` as one block under the key given."""
    key = _key(args)
    data = read_bytes(args.file)
    with _pool(args) as pool:
        node = pool.owner(key)
        limit = pool.reach([node])[node].limits.max_block_size
        if not 0 < len(data) <= limit:
            raise CliError(ExitCode.USAGE, f"{args.file} is {len(data)} bytes; {node} takes blocks of 1..{limit}")
        status = pool.client.put([key], [data]).statuses[0]
    if status not in _PUT_OK:
        raise from_status(status, str(key), node)
    _print_block(args, key, node, len(data), status)
    return ExitCode.OK


def run_get(args: argparse.Namespace) -> ExitCode:
    """Fetch one block into ``args.output`` (``-`` for stdout); exit 4 on a miss."""
    if args.json and args.output == "-":
        raise CliError(ExitCode.USAGE, "--json needs -o FILE: with -o - stdout carries the block")
    key = _key(args)
    with _pool(args) as pool:
        node = pool.owner(key)
        pool.reach([node])
        result = pool.client.get([key])
    status, buffer = result.statuses[0], result.buffers[0]
    if status is not ErrorCode.OK or buffer is None:
        raise from_status(status, str(key), node)
    assert isinstance(buffer, memoryview)  # a get without destinations gives a buffer a block
    write_bytes(args.output, buffer)
    if args.output != "-":
        _print_block(args, key, node, len(buffer), status, output=args.output)
    return ExitCode.OK


def run_rm(args: argparse.Namespace) -> ExitCode:
    """Delete one block; exit 4 if it was not stored."""
    key = _key(args)
    with _pool(args) as pool:
        node = pool.owner(key)
        pool.reach([node])
        deleted = pool.client.delete([key])[0]
    if not deleted:
        raise from_status(ErrorCode.NOT_FOUND, str(key), node)
    _print_block(args, key, node, None, ErrorCode.OK)
    return ExitCode.OK


def run_flush(args: argparse.Namespace) -> ExitCode:
    """Delete every block of a namespace, or of every namespace of a model, on every node."""
    with _pool(args) as pool:
        nodes = [m.address for m in pool.router.members()]
        pool.reach(nodes)
        deleted = pool.client.flush_model(args.model) if args.model else pool.client.flush_namespace(args.namespace)
    what = ("model", args.model) if args.model else ("namespace", args.namespace)
    fields = {what[0]: what[1], "nodes": len(nodes), "deleted": deleted}
    if args.json:
        fmt.print_json(fields)
    else:
        print(fmt.key_values(fields.items()))
        if not deleted and args.namespace and "@" not in args.namespace:
            print(
                f"note: no namespace {args.namespace!r}; ids look like model@dtype@layout@tpRofS, "
                f"and --model {args.namespace} empties every namespace of a model",
                file=sys.stderr,
            )
    return ExitCode.OK


def _print_block(
    args: argparse.Namespace, key: BlockKey, node: str, size: int | None, status: ErrorCode, output: str | None = None
) -> None:
    fields: dict[str, object] = {"key": key.hash.hex(), "namespace": key.namespace, "node": node}
    if size is not None:
        fields["bytes"] = size
    if output is not None:
        fields["output"] = output
    fields["status"] = status.name
    if args.json:
        fmt.print_json(fields)
    else:
        print(fmt.key_values(fields.items()))


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of a token sequence's full blocks the pool holds."""

    namespace: str
    block_size: int
    tokens: int
    keys: list[BlockKey]
    stored: list[bool]  # one per key

    @property
    def leading_blocks(self) -> int:
        return next((i for i, s in enumerate(self.stored) if not s), len(self.stored))

    def as_json(self) -> dict[str, object]:
        pairs = enumerate(zip(self.keys, self.stored, strict=True))
        blocks = [{"index": i, "hash": key.hash.hex(), "stored": stored} for i, (key, stored) in pairs]
        return {
            "namespace": self.namespace,
            "block_size": self.block_size,
            "tokens": self.tokens,
            "full_blocks": len(self.keys),
            "leading_blocks": self.leading_blocks,
            "leading_tokens": self.leading_blocks * self.block_size,
            "stored_blocks": sum(self.stored),
            "blocks": blocks,
        }

    def summary(self) -> str:
        full, leading = len(self.keys), self.leading_blocks
        left = self.tokens - full * self.block_size
        return fmt.key_values(
            [
                ("namespace", self.namespace),
                ("tokens", f"{self.tokens} ({full} full blocks of {self.block_size}, {left} left over)"),
                ("in pool", f"{leading} leading blocks = {leading * self.block_size} tokens"),
                ("stored", f"{sum(self.stored)} of {full} blocks"),
            ]
        )

    def blocks_table(self) -> str:
        bs = self.block_size
        rows = [
            (i, f"{i * bs}-{(i + 1) * bs - 1}", key.hash.hex(), "yes" if stored else "no")
            for i, (key, stored) in enumerate(zip(self.keys, self.stored, strict=True))
        ]
        return fmt.table(("BLOCK", "TOKENS", "HASH", "STORED"), rows, right=(0,))


def run_lookup(args: argparse.Namespace) -> ExitCode:
    """Hash a token file's full blocks and report how many leading blocks the pool holds."""
    try:
        namespace = Namespace(args.namespace_model, args.dtype, args.layout, args.tp_rank, args.tp_size)
        builder = BlockKeyBuilder(namespace, args.block_size, seed=args.seed, scheme=args.scheme)
    except UsageError as exc:
        raise CliError(ExitCode.USAGE, f"fix the namespace options: {exc.args[0]}") from None
    tokens = read_tokens(args.token_file)
    keys = builder.keys(tokens)
    with _pool(args) as pool:
        # exists() counts a down node as "not stored": find out first.
        pool.reach(pool.owner(k) for k in keys)
        stored = pool.client.exists(keys)
    coverage = Coverage(namespace.id, args.block_size, len(tokens), keys, stored)
    if args.json:
        fmt.print_json(coverage.as_json())
        return ExitCode.OK
    print(coverage.summary())
    if args.verbose and keys:
        print()
        print(coverage.blocks_table())
    return ExitCode.OK
