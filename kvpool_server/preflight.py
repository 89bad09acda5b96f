"""What can be checked before the daemon maps and prefaults its arena, which takes seconds per GiB.

A port in use or a ``/dev/shm`` too small then fails at once with a message that names the
setting, instead of after minutes of prefaulting. Settings that work but are likely mistakes
are warned about.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import stat

from kvpool_server.config import ServerConfig, format_byte_size


def check(config: ServerConfig) -> list[str]:
    """Fail fast on what cannot work; returns warnings about what probably should not be.

    Raises:
        OSError: a configured port is in use, or ``shm_dir`` cannot hold the arena.
    """
    _check_ports(config)
    _check_shm(config)
    return _warnings(config)


def _check_ports(config: ServerConfig) -> None:
    """Each fixed port is free now (0, ephemeral, and -1, off, are not checked)."""
    for setting, port in (
        ("grpc_port", config.grpc_port),
        ("data_port", config.data_port),
        ("metrics_port", config.metrics_port),
        ("ucx_port", config.ucx_port),
    ):
        if port <= 0:
            continue
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((config.host, port))
            except OSError as exc:
                raise OSError(f"{setting} {config.host}:{port}: {exc.strerror or exc}") from None


def _check_shm(config: ServerConfig) -> None:
    need = config.dram_capacity + config.dram.arena_extra_bytes()  # blocks, generations, shared index
    free = shutil.disk_usage(config.shm_dir).free
    if free < need:
        raise OSError(
            f"shm_dir {config.shm_dir} has {format_byte_size(free)} free; "
            f"the DRAM arena needs {format_byte_size(need)} "
            "(dram_capacity): lower --dram-capacity, or give the daemon a larger /dev/shm "
            "(docker run --shm-size, a Kubernetes emptyDir with medium: Memory and a sizeLimit)"
        )


def _warnings(config: ServerConfig) -> list[str]:
    warnings = []
    if config.auth_token_file and os.stat(config.auth_token_file).st_mode & (stat.S_IROTH | stat.S_IWOTH):
        warnings.append(f"auth_token_file {config.auth_token_file} is readable by every user: chmod 0600 it")
    if not config.auth_token_file and not _loopback(config.host):
        warnings.append(
            f"host {config.host} is reachable from other machines and no auth_token_file is set: "
            "anyone who reaches the ports can read, write and flush blocks"
        )
    if config.ssd_dir and config.ssd_capacity > shutil.disk_usage(_existing(config.ssd_dir)).free:
        free = shutil.disk_usage(_existing(config.ssd_dir)).free
        warnings.append(
            f"ssd_capacity {format_byte_size(config.ssd_capacity)} is more than the "
            f"{format_byte_size(free)} free under {config.ssd_dir}: writes will fail before it fills"
        )
    return warnings


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _existing(path: str) -> str:
    """``path`` or its nearest existing parent (the SSD folder may not exist yet)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path
