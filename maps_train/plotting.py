"""matplotlib for files, never a window: every plot of the package is drawn through `pyplot()`."""

from __future__ import annotations


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (headless machines, CI, subprocesses)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
