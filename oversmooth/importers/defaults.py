"""Library defaults a command line shows in its help, in a module that imports nothing heavy.

The command line (``oversmooth.commands``) reads them from here when it builds its parser, before
any onnx or NumPy is imported; the library uses the same names, so a default is stated once.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "AUTO_EVERY",
    "AUTO_FIRST",
    "AUTO_WIDTH",
    "BATCH_SIZE",
    "DEPTH_INPUTS",
    "DOMINANCE_MODES",
    "H_CHOICES",
    "OPERATOR_INPUTS",
    "PROVIDERS",
    "RANDOM_SEQ_LEN",
    "RANDOM_VOCAB_SIZE",
    "Granularity",
    "HChoice",
    "Provider",
]

#: onnxruntime execution providers an audit may ask for (``auto``: CUDA where it really works).
Provider = Literal["auto", "cpu", "cuda"]
PROVIDERS: tuple[Provider, ...] = get_args(Provider)
#: H granularity of the dominance table, or no dominance step (:class:`~oversmooth.importers.audit.pipeline.AuditOptions`).
Granularity = Literal["head", "layer", "operator", "operating", "none"]
DOMINANCE_MODES: tuple[Granularity, ...] = get_args(Granularity)
#: The H of the dominance step: the effective product of the branch's linear factors, or W_V W_O.
HChoice = Literal["effective", "stored"]
H_CHOICES: tuple[HChoice, ...] = get_args(HChoice)
#: Inputs per onnxruntime call of an audit (bounds memory; never changes a number).
BATCH_SIZE = 4
#: The size of every open axis after the first in random inputs (tokens; an open image side).
RANDOM_SEQ_LEN = 32
#: Random token ids are drawn below this.
RANDOM_VOCAB_SIZE = 1000

#: Inputs the exact operator dominance runs on by default (``dominance="operator"``): its cost is
#: a few hundred applications of each block's operator per input (DINOv2 on 2 CPU cores: 384 of
#: them and about 6 s per (input, block), 11x the whole per-head audit for one input).
OPERATOR_INPUTS = 2

#: Inputs the depth step's attention spectra run on by default (|λ₂(A_h)| and each head's growth
#: of HFC/LFC: one (n−1)×(n−1) eigensolve per (input, block, head), about 25 ms at n = 257 on one
#: core, so DINOv2's 72 heads add about 1.8 s of CPU per input; docs/theory.md §6.11).
DEPTH_INPUTS = 1
#: ``--dominance-inputs auto``: every share's 95 % interval over inputs at most this wide (5
#: percentage points), looked at after AUTO_FIRST inputs (fewer all count) and every AUTO_EVERY
#: after that (:mod:`oversmooth.importers.audit.dominance_inputs`).
AUTO_WIDTH = 0.05
AUTO_FIRST = 32
AUTO_EVERY = 16
