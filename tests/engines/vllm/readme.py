"""The README's ``--kv-transfer-config`` blocks: what the tests run is what users copy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[3] / "README.md"


def kv_transfer_configs() -> list[dict[str, Any]]:
    """Every ``--kv-transfer-config '...'`` JSON of the README, in order."""
    blocks = re.findall(r"--kv-transfer-config '(\{.*?\})'", README.read_text())
    assert blocks, "the README has no --kv-transfer-config block"
    return [json.loads(b) for b in blocks]


def connector_config(nodes: str) -> dict[str, Any]:
    """The README's KVPoolConnector block, pointed at ``nodes``."""
    (config,) = [c for c in kv_transfer_configs() if c["kv_connector"] == "KVPoolConnector"]
    config["kv_connector_extra_config"]["nodes"] = nodes
    return config


def tier_config(**tier: Any) -> dict[str, Any]:
    """The README's OffloadingConnector block with ``tier`` settings (nodes, ...) on its KVPoolTier entry."""
    (config,) = [c for c in kv_transfer_configs() if c["kv_connector"] == "OffloadingConnector"]
    (entry,) = config["kv_connector_extra_config"]["secondary_tiers"]
    assert entry["type"] == "KVPoolTier", entry
    entry.update(tier)
    return config
