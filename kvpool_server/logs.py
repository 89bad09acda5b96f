"""Structured logs: one JSON object per line (or plain text for humans)."""

from __future__ import annotations

import json
import logging
import sys
import time

# Attributes every LogRecord has; anything else came from ``extra=`` and is a field.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, node_id: str) -> None:
        super().__init__()
        self._node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "node": self._node_id,
            "msg": record.getMessage(),
        }
        fields.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return json.dumps(fields, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD)
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()} {extra}".rstrip()
        return line + ("\n" + self.formatException(record.exc_info) if record.exc_info else "")


def configure_logging(level: str, fmt: str, node_id: str) -> None:
    """Send kvpool's logs to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(node_id) if fmt == "json" else TextFormatter())
    root = logging.getLogger("kvpool")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
