"""oversmooth's theory simulator: NumPy only, float64, batched over leading axes ``(..., n, d)``.

Modules
-------
spectra     -- synthetic attention matrices A and value-projection matrices H with chosen spectra
attention   -- softmax, LayerNorm (ONNX semantics), RMSNorm, attention matrices
updates     -- the update rules: linear, softmax attention, Pre-/Post-LN, MLP, mitigations
dynamics    -- iteration to great depth with renormalisation and per-layer metrics
metrics     -- smoothing metrics: hfc_lfc, cosine, sigma_ratio, rank1_residual, dong_residual, effective_rank
theory      -- Kronecker-free eigenvalues, dominating eigenvalue, predicted regime, rate and limits
checks      -- the paper's checkable claims as data (``oversmooth verify``)
"""

from simulator.errors import InputError, NumericalFloorWarning, OversmoothError

__version__ = "0.1.0"
__all__ = ["InputError", "NumericalFloorWarning", "OversmoothError", "__version__"]
