"""A NIXL agent as both ends use it: memory registered by address, transfers run to the end.

NIXL (NVIDIA's transfer library, over UCX here) moves bytes one-sided: the initiator reads
or writes memory another process registered, and that process's CPU takes no part (UCX's
``cma`` on one host, RDMA between hosts). kvpool uses only NIXL's core: an agent per process,
memory registered once by (address, length), and READ/WRITE transfers between lists of
(address, length) spans. Its metadata exchange (listener threads, etcd) is not used: a node
hands its agent's metadata to proven clients over the data connection (the ``PEER`` op).

Without a progress thread (the Python wrapper's spins a whole core, delay 0): the initiator
progresses its agent while it waits for a transfer, and a node progresses its own now and then
(:mod:`kvpool_server.data.nixl`); UCX needs that only to set up a connection, or to emulate
one-sided reads over plain TCP. NIXL comes from kvpool's ``nixl`` extra (``nixl-cu12``: it
runs without a GPU); nothing here imports it until an agent is made.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Sequence
from typing import Any

from kvpool_client.core.channels.ucx_builds import other_build
from kvpool_client.core.errors import ErrorCode, KVPoolError, NodeUnavailable

Span = tuple[int, int]  # (address, length) in some process's memory

_MODULES = ("nixl._api", "nixl_cu13._api", "nixl_cu12._api")  # the meta package, or a build of it


class NixlUnavailable(KVPoolError):
    """NIXL cannot be used here (not installed, no UCX backend), or the node offers no NIXL peer."""

    code = ErrorCode.UNAVAILABLE


def _api() -> Any:
    """NIXL's Python API module.

    Raises:
        NixlUnavailable: no NIXL build is installed.
    """
    errors = []
    for name in _MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise NixlUnavailable(f"nixl cannot be imported ({'; '.join(errors)}); pip install 'kvpool[nixl]'")


def import_error() -> str | None:
    """Why NIXL cannot be imported here; None when it can."""
    try:
        _api()
    except NixlUnavailable as exc:
        return str(exc.args[0])
    return None


class Agent:
    """One NIXL agent with the UCX backend and no progress thread.

    Args:
        name: unique among the agents that will know each other (a node's carries its arena id,
            so a restarted node's agent is a new one).

    Raises:
        NixlUnavailable: NIXL is missing or its UCX backend cannot start.
    """

    def __init__(self, name: str) -> None:
        other = other_build("nixl")
        if other is not None:
            raise NixlUnavailable(
                f"this process loaded another UCX already ({other}: the ucx transport); beside it NIXL's UCX "
                "finds only TCP and cannot share the process: use one of the two per process"
            )
        api = _api()
        try:
            self._agent = api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        except Exception as exc:  # nixl raises bare exceptions from its bindings
            raise NixlUnavailable(f"cannot start a nixl agent: {exc}") from exc
        if "UCX" not in self._agent.backends:
            raise NixlUnavailable("nixl has no UCX backend here")
        self.name = name
        self._peers: set[str] = set()

    def register(self, address: int, length: int) -> Any:
        """Register ``length`` bytes of this process's memory from ``address``; returns the handle
        :meth:`deregister` takes."""
        return self._agent.register_memory([(address, length, 0, "")], "DRAM")

    def deregister(self, handle: Any) -> None:
        self._agent.deregister_memory(handle)

    def metadata(self) -> bytes:
        """What another agent needs to reach this one's registered memory."""
        return bytes(self._agent.get_agent_metadata())

    def add_peer(self, metadata: bytes) -> str:
        """Know another agent by its metadata; returns its name.

        Raises:
            NixlUnavailable: the metadata is not an agent's (another node lied, or speaks another NIXL).
        """
        try:
            name = self._agent.add_remote_agent(metadata)
        except Exception as exc:
            raise NixlUnavailable(f"cannot add the node's nixl agent: {exc}") from exc
        name = name.decode() if isinstance(name, bytes) else str(name)
        self._peers.add(name)
        return name

    def remove_peer(self, name: str) -> None:
        if name in self._peers:
            self._peers.discard(name)
            self._agent.remove_remote_agent(name)

    def transfer(self, op: str, local: Sequence[Span], remote: Sequence[Span], peer: str, timeout_s: float) -> None:
        """Move bytes between ``local`` spans and ``peer``'s ``remote`` spans (pairwise, equal
        lengths): ``READ`` brings them here, ``WRITE`` sends them; returns once done.

        Raises:
            NodeUnavailable: the transfer failed (the peer is gone, or refused the spans) or took
                longer than ``timeout_s``.
        """
        if not remote:
            return
        agent = self._agent
        try:
            handle = agent.initialize_xfer(
                op,
                agent.get_xfer_descs([(a, n, 0) for a, n in local], "DRAM"),
                agent.get_xfer_descs([(a, n, 0) for a, n in remote], "DRAM"),
                peer,
            )
        except Exception as exc:
            raise NodeUnavailable(f"nixl {op} to {peer} cannot start: {exc}") from exc
        try:
            state = agent.transfer(handle)
            deadline = time.monotonic() + timeout_s
            while state == "PROC":  # each check progresses this agent's UCX worker
                if time.monotonic() > deadline:
                    raise NodeUnavailable(f"nixl {op} to {peer} took over {timeout_s} s")
                state = agent.check_xfer_state(handle)
            if state != "DONE":
                raise NodeUnavailable(f"nixl {op} to {peer} failed ({state})")
        except NodeUnavailable:
            raise
        except Exception as exc:
            raise NodeUnavailable(f"nixl {op} to {peer} failed: {exc}") from exc
        finally:
            _release(agent, handle)

    def progress(self) -> None:
        """Progress the agent's UCX worker once (connection setup; reads emulated over TCP)."""
        self._agent.get_new_notifs()


def _release(agent: Any, handle: Any) -> None:
    """Release a transfer's handle; one still in flight (a peer that hangs) cannot be, and is left."""
    with contextlib.suppress(Exception):  # the handle stays with the agent, freed when it goes
        agent.release_xfer_handle(handle)
