"""Library defaults a command line shows in its help, in a module that imports nothing heavy.

The command line (``oversmooth.commands``) reads them from here when it builds its parser, before
any onnx or NumPy is imported; the library uses the same names, so a default is stated once.
"""

from __future__ import annotations

__all__ = ["OPERATOR_INPUTS"]

#: Inputs the exact operator dominance runs on by default (``dominance="operator"``): its cost is
#: a few hundred applications of each block's operator per input (DINOv2 on 2 CPU cores: 384 of
#: them and about 6 s per (input, block), 11x the whole per-head audit for one input).
OPERATOR_INPUTS = 2
