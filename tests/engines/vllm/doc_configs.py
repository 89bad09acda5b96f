"""docs/vllm.md's ``--kv-transfer-config`` blocks: what the tests run is what users copy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "vllm.md"


def kv_transfer_configs() -> list[dict[str, Any]]:
    """Every ``--kv-transfer-config '...'`` JSON of docs/vllm.md, in order."""
    blocks = re.findall(r"--kv-transfer-config '(\{.*?\})'", GUIDE.read_text())
    assert blocks, "docs/vllm.md has no --kv-transfer-config block"
    return [json.loads(b) for b in blocks]


def connector_config(nodes: str) -> dict[str, Any]:
    """The guide's KVPoolConnector block, pointed at ``nodes``."""
    (config,) = [c for c in kv_transfer_configs() if c["kv_connector"] == "KVPoolConnector"]
    config["kv_connector_extra_config"]["nodes"] = nodes
    return config


def tier_config(**tier: Any) -> dict[str, Any]:
    """The guide's OffloadingConnector block with ``tier`` settings (nodes, ...) on its KVPoolTier entry."""
    (config,) = [c for c in kv_transfer_configs() if c["kv_connector"] == "OffloadingConnector"]
    (entry,) = config["kv_connector_extra_config"]["secondary_tiers"]
    assert entry["type"] == "KVPoolTier", entry
    entry.update(tier)
    return config
