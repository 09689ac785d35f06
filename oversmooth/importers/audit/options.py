"""Every option of an audit, as one checked value: :class:`AuditOptions`.

Split from :mod:`oversmooth.importers.audit.pipeline` (which re-exports it); the CLI, the sharded audit and the
Python API all build one.

Public API
----------
AuditOptions
    The options, checked once when made.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oversmooth.importers.audit.dominance_inputs import DominanceInputs, check_dominance_inputs
from oversmooth.importers.defaults import (
    BATCH_SIZE,
    DEPTH_INPUTS,
    DOMINANCE_MODES,
    OPERATOR_INPUTS,
    Granularity,
    Provider,
)
from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.value_spectra import H_CHOICES, HChoice
from oversmooth.importers.zoo import ZooModel
from oversmooth.simulator.tolerances import TIE_RTOL
from oversmooth.simulator.validation import check_choice, check_positive_int

__all__ = ["AuditOptions"]


@dataclass(frozen=True)
class AuditOptions:
    """Every option of an audit, checked once when made (:class:`ImporterInputError` otherwise).

    Attributes
    ----------
    provider : {"auto", "cpu", "cuda"}
        onnxruntime execution provider; ``"cuda"`` fails unless the session really runs on CUDA.
    batch_size : int
        Inputs per onnxruntime call (bounds memory). A graph that fixes its batch size runs at
        that size; one with nodes that mix the inputs of a batch (``DynamicQuantizeLinear``) runs
        every input alone, so the numbers never depend on it (a note says so; see
        :mod:`oversmooth.importers.runtime.batching`).
    exclude_prefix : bool or int
        Leave prefix tokens out of the metrics: True uses the zoo's count (CLS = 1), an int counts.
    dominance : {"head", "layer", "operator", "none"}
        H granularity of the dominance table, or skip it (no attention tensors fetched);
        ``"operator"`` is ``"head"`` plus the exact dominance of each block's whole operator
        ``I + Σ_h M_hᵀ ⊗ A_h`` on the first ``operator_inputs`` inputs
        (:mod:`oversmooth.importers.audit.operator_step`); ``"operating"`` is ``"head"`` plus the operator
        frozen at each input's norm, ``X + Σ_h A_h D X M_h`` (:mod:`oversmooth.importers.audit.operating_step`).
        Every mode but ``"none"`` attributes each block's change on those inputs.
    dominance_inputs : int, "all" or "auto"
        Inputs the dominance step (the per-head table and its shares) uses: the first N, every
        one, or (default) the first whose four shares' 95 % intervals over inputs are all at most
        5 points wide, looked at after 32 inputs and every 16 after that (fewer than 32: all);
        :mod:`oversmooth.importers.audit.dominance_inputs`. The layer metrics always cover every input.
    operator_inputs : int
        Inputs of the operator dominance (default :data:`~oversmooth.importers.defaults.OPERATOR_INPUTS`).
    depth_inputs : int
        Inputs of the depth step's attention spectra (``|λ₂(A_h)|``, each head's predicted growth
        of HFC/LFC; default :data:`~oversmooth.importers.defaults.DEPTH_INPUTS`; docs/theory.md §6.11).
        Needs a dominance step (its attention and H); 0 is refused, ``dominance="none"`` skips it.
    h : {"effective", "stored"}
        The H of the dominance step: the effective product of every linear factor of the branch
        (default), or ``W_V W_O`` as the checkpoint stores it (the paper's protocol).
    spectral_norm : bool
        Also the HFC/LFC in the spectral norm (the poster's variant, metric ``hfc_lfc_spectral``:
        ``||X − 𝟙x̄ᵀ||₂ / ||𝟙x̄ᵀ||₂``, from the Gram matrix the spectral metrics already reduce);
        needs ``spectral``.
    spectral : bool
        Compute the singular-value metrics (sigma_ratio, rank1_residual, effective_rank). They
        need one min(T, D)² Gram matrix per input and layer from the device, most of what an
        audit on a GPU moves; without them those columns are NaN and a note says so.
    partial : bool
        Audit a model whose attention is only partly matched; the first note then names the
        missing blocks (else :class:`~oversmooth.importers.match.IncompleteMatchError`, exit status 1).
    tie_rtol : float
        Relative tolerance for ties of |μ|.
    progress : bool
        Show a progress bar (stderr).
    cache : bool
        Reuse (and store) the input-independent value spectra in the per-user cache, keyed by
        the model file's sha256 (:mod:`oversmooth.importers.audit.cache`); False computes them afresh.
    threads : int, optional
        The cores the audit may use: onnxruntime's intra-op threads and the threads of the host
        work (metrics, dominance). Default: every core this process may use
        (:func:`~oversmooth.importers.runtime.runner.default_threads`); a shard on a cluster worker, its
        worker's share of its host's cores.
    """

    provider: Provider = "auto"
    batch_size: int = BATCH_SIZE
    exclude_prefix: bool | int = False
    dominance: Granularity = "head"
    dominance_inputs: DominanceInputs = "auto"
    operator_inputs: int = OPERATOR_INPUTS
    depth_inputs: int = DEPTH_INPUTS
    h: HChoice = "effective"
    spectral: bool = True
    spectral_norm: bool = False
    partial: bool = False
    tie_rtol: float = TIE_RTOL
    progress: bool = False
    cache: bool = True
    threads: int | None = None

    def __post_init__(self) -> None:
        check_choice(self.dominance, "dominance", DOMINANCE_MODES, error=ImporterInputError)
        check_choice(self.h, "h", H_CHOICES, error=ImporterInputError)
        check_dominance_inputs(self.dominance_inputs)
        check_positive_int(self.operator_inputs, "operator_inputs", error=ImporterInputError)
        check_positive_int(self.depth_inputs, "depth_inputs", error=ImporterInputError)
        if self.spectral_norm and not self.spectral:
            raise ImporterInputError(
                "`spectral_norm` needs the Gram matrices of the spectral metrics; got spectral False"
            )
        check_positive_int(self.batch_size, "batch_size", error=ImporterInputError)
        if self.threads is not None:
            check_positive_int(self.threads, "threads", error=ImporterInputError)
        if not isinstance(self.exclude_prefix, bool) and (
            not isinstance(self.exclude_prefix, int | np.integer) or self.exclude_prefix < 0
        ):
            raise ImporterInputError(
                "`exclude_prefix` must be a bool or a non-negative integer; "
                f"got {self.exclude_prefix!r}"
            )

    def prefix_count(self, entry: ZooModel | None) -> int:
        """Prefix tokens left out of the metrics: the zoo's count for ``True`` (else 1)."""
        if isinstance(self.exclude_prefix, bool):
            if not self.exclude_prefix:
                return 0
            return int(entry.prefix_tokens) if entry is not None else 1
        return int(self.exclude_prefix)
