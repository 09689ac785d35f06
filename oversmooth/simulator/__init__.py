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
tolerances  -- every numerical tolerance, named once (checks and tests share it)
systems     -- loading, drawing and saving the (A, W_V, W_proj, X0) systems ``simulate`` runs
output      -- atomic files and folders, the tidy-CSV writer, strict JSON, provenance
validation  -- argument checks at public boundaries
"""

from importlib import metadata

from oversmooth.simulator.errors import InputError, NumericalFloorWarning, OversmoothError

try:  # the one version string is pyproject.toml's; the installed metadata carries it
    __version__ = metadata.version("oversmooth")
except metadata.PackageNotFoundError:  # pragma: no cover - running from an uninstalled tree
    __version__ = "0+unknown"
__all__ = ["InputError", "NumericalFloorWarning", "OversmoothError", "__version__"]
