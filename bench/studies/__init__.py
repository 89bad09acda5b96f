"""One-off studies that informed a decision, rerun rarely; each says when it last ran and where its results are.

``copies.py`` (copy methods by destination alignment), ``slab_fit.py`` (what a slab size
costs) and ``index.py`` (the daemon's index at scale).
"""
