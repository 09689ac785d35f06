"""Training small ViTs in three variants (standard, ⁺, ⁻) and measuring what training made.

The fourth library, beside ``simulator``, ``importers`` and ``figures``: it may import
``oversmooth.simulator`` and nothing else of the project, and it is the only place where torch is
imported (the ``train`` extra: ``pip install 'oversmooth[train]'`` installs torch and
scikit-learn). Modules that need no torch (:mod:`~oversmooth.training.corruptions`,
:mod:`~oversmooth.training.effective`, the ``.npz`` reader of :mod:`~oversmooth.training.data`)
import without it, so their users and tests do not need the extra.

- :mod:`~oversmooth.training.parametrisation`: W_V^h W_O^h = V_h diag(±ψ_h²) V_hᵀ from a QR.
- :mod:`~oversmooth.training.effective`: the effective per-head product of trained weights (NumPy).
- :mod:`~oversmooth.training.model`: the small ViT.
- :mod:`~oversmooth.training.data`: sklearn's digits or a user ``.npz``, stratified fractions.
- :mod:`~oversmooth.training.corruptions`: Gaussian noise and blur at severities 1–5 (NumPy).
- :mod:`~oversmooth.training.train`: one deterministic training run and its typed record.
- :mod:`~oversmooth.training.export`: a trained model to ONNX for ``oversmooth audit``.
"""

#: The message of every "torch is missing" error (one line, names the extra).
MISSING_TORCH = "training needs torch: install the train extra, pip install 'oversmooth[train]'"
