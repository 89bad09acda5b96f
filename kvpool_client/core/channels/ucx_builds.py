"""Which UCX builds are loaded in this process: two cannot share one.

ucxx (the ``ucx`` transport) and NIXL (the ``nixl`` transport) each ship a UCX of their own.
Measured: once ucxx is imported (its UCX libraries loaded, no context started yet), an agent
NIXL makes afterwards finds no shared-memory or ``cma`` transport, only TCP, and so emulates
every one-sided read and write through the node's CPU; and a second build *started* beside a
first breaks the first one's transfers (they hang, or the process crashes). So a process uses
one of the two: each side checks before it loads or starts its UCX, and the first one loaded
keeps the process. A build is known by the folder its core library (``libucs``) lies in.
"""

from __future__ import annotations

import re
from pathlib import PurePath

_MAPS = "/proc/self/maps"
_CORE = re.compile(r"libucs(-[0-9a-f]+)?\.so")  # as built, or renamed by a wheel's repair (libucs-<hash>.so)


def loaded_builds(maps: str = _MAPS) -> set[str]:
    """The folders of the UCX builds whose core library this process has loaded."""
    try:
        with open(maps) as lines:
            paths = {line.split(maxsplit=5)[-1].strip() for line in lines if "/libucs" in line}
    except OSError:  # not Linux: nothing to tell, nothing refused
        return set()
    return {str(PurePath(path).parent) for path in paths if _CORE.match(PurePath(path).name)}


def other_build(own: str, maps: str = _MAPS) -> str | None:
    """A loaded build whose folder does not contain ``own`` (``"nixl"``: NIXL's), or None."""
    return next((folder for folder in sorted(loaded_builds(maps)) if own not in folder), None)


def nixl_build(maps: str = _MAPS) -> str | None:
    """NIXL's build, when it is loaded in this process; else None."""
    return next((folder for folder in sorted(loaded_builds(maps)) if "nixl" in folder), None)
