"""The installed kvpool's version (pyproject.toml is its one source), for --version, ServerInfo and metrics."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    """The version pip installed, or ``0+unknown`` when running from a source tree that is not installed."""
    try:
        return version("kvpool")
    except PackageNotFoundError:
        return "0+unknown"
