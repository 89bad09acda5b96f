"""docs/lmcache.md's LMCache config block: what the tests load is what users copy."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DOC = Path(__file__).resolve().parents[3] / "docs" / "lmcache.md"
PLUGIN = "remote_storage_plugin.kvpool."


def doc_config() -> dict[str, Any]:
    """The doc's first ``yaml`` block: the LMCache config a user types."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, "docs/lmcache.md has no yaml block"
    config = yaml.safe_load(blocks[0])
    assert isinstance(config, dict) and config.get("remote_storage_plugins") == ["kvpool"], config
    return config


def plugin_config(chunk_size: int, **settings: Any) -> dict[str, Any]:
    """The doc's config for a test engine: small chunks and local CPU memory, and the plugin's
    settings (``nodes=...``, ...) as ``remote_storage_plugin.kvpool.<key>``; a None value
    removes that key."""
    config = doc_config()
    config["chunk_size"] = chunk_size
    config["max_local_cpu_size"] = 0.05  # GB
    extra = config["extra_config"]
    for key, value in settings.items():
        if value is None:
            extra.pop(PLUGIN + key, None)
        else:
            extra[PLUGIN + key] = value
    return config
