"""Which UCX builds run in this process: two cannot share one.

ucxx (the ``ucx`` transport) and NIXL (the ``nixl`` transport) each ship a UCX of their own.
A build loads its transport modules (``ucx/libuct_*.so``) when its first context starts, and
a second build started in the same process then breaks the first one's transfers or its own
(they hang, or the process crashes). So a process uses one of the two; each side checks
before it starts its UCX. A build is known by the folder its modules were loaded from.
"""

from __future__ import annotations

from pathlib import PurePath

_MAPS = "/proc/self/maps"


def started_builds(maps: str = _MAPS) -> set[str]:
    """The folders of the UCX builds whose transport modules this process has loaded."""
    try:
        with open(maps) as lines:
            paths = {line.split(maxsplit=5)[-1].strip() for line in lines if "/ucx/libuct_" in line}
    except OSError:  # not Linux: nothing to tell, nothing refused
        return set()
    return {str(PurePath(path).parent) for path in paths}


def other_build(own: str, maps: str = _MAPS) -> str | None:
    """A started build whose folder does not contain ``own`` (``"nixl"``: NIXL's), or None."""
    return next((folder for folder in sorted(started_builds(maps)) if own not in folder), None)


def nixl_build(maps: str = _MAPS) -> str | None:
    """NIXL's build, when it started in this process; else None."""
    return next((folder for folder in sorted(started_builds(maps)) if "nixl" in folder), None)
