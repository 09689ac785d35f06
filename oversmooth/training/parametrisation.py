"""The ⁺/⁻ value–output parametrisation: each head's W_V^h W_O^h = V_h diag(s·ψ_h²) V_hᵀ.

Per head h (d = d_model, k = d_head, H heads with H·k = d):

- free parameters Θ_h ∈ ℝ^{d×k} and ψ_h ∈ ℝ^k;
- the reduced QR ``Θ_h = V_h R_h`` with V_h ∈ ℝ^{d×k} of orthonormal columns, made unique by
  requiring diag(R_h) > 0 (we multiply column j of Q and row j of R by sign(R_jj); a zero R_jj,
  a rank-deficient Θ_h, keeps sign +1). With this convention the map Θ_h ↦ V_h is smooth wherever
  Θ_h has full column rank (it is the Gram–Schmidt map), so gradients through it are well defined;
- ``Λ_h = diag(s·ψ_h²)`` with s = +1 for the ⁺ variant (every eigenvalue ≥ 0: smoothing, the
  paper's ViT⁺) and s = −1 for the ⁻ variant (every eigenvalue ≤ 0: no smoothing, ViT⁻);
- the head's product ``W_VO^h = V_h Λ_h V_hᵀ`` (d×d, symmetric, rank k, range = span V_h), its
  nonzero eigenvalues exactly s·ψ_h², computed as the two factors ``W_V^h = V_h`` (d×k) and
  ``W_O^h = Λ_h V_hᵀ`` (k×d), so the block runs as an ordinary multi-head attention.

No clip is applied (the paper mentions clipping the ⁻ spectrum to [−1, 0]); the sign is what the
parametrisation guarantees, not a modulus bound.

The *effective* H of a pre-LN block is not W_VO^h but ``M_h = C diag(γ) W_VO^h`` with the norm's
centring C = I − 𝟙𝟙ᵀ/d and weight γ; it is no longer symmetric, and its nonzero eigenvalues are
those of ``Λ_h V_hᵀ C diag(γ) V_h``: the same signs as Λ_h for a uniform positive γ, not
guaranteed otherwise (:mod:`oversmooth.training.effective`, which computes them from weights).

Weights are in the row-vector convention ``y = x @ W`` (as everywhere in the project): heads are
contiguous column blocks of W_V and row blocks of W_O.
"""

from __future__ import annotations

import torch

__all__ = ["SIGNS", "head_products", "orthonormal_basis", "value_output"]

#: The sign s of Λ_h per variant.
SIGNS = {"plus": 1.0, "minus": -1.0}


def orthonormal_basis(theta: torch.Tensor) -> torch.Tensor:
    """V of the reduced QR of Θ with diag(R) ≥ 0 (deterministic signs).

    Parameters
    ----------
    theta : Tensor, shape (..., d, k), k ≤ d

    Returns
    -------
    Tensor, shape (..., d, k)
        Orthonormal columns spanning Θ's range: ``Vᵀ V = I_k``.
    """
    q, r = torch.linalg.qr(theta, mode="reduced")
    diagonal = torch.diagonal(r, dim1=-2, dim2=-1)
    signs = torch.where(diagonal < 0, -torch.ones_like(diagonal), torch.ones_like(diagonal))
    return q * signs.unsqueeze(-2)


def value_output(
    theta: torch.Tensor, psi: torch.Tensor, sign: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The factors ``W_V = [V_1 … V_H]`` (d×Hk) and ``W_O = [Λ_1 V_1ᵀ; …; Λ_H V_Hᵀ]`` (Hk×d).

    Parameters
    ----------
    theta : Tensor, shape (H, d, k)
    psi : Tensor, shape (H, k)
    sign : float
        +1 (⁺) or −1 (⁻).

    Returns
    -------
    W_V : Tensor, shape (d, H·k)
    W_O : Tensor, shape (H·k, d)
        ``W_V[:, hk:(h+1)k] @ W_O[hk:(h+1)k, :] = V_h diag(s ψ_h²) V_hᵀ``.
    """
    heads, d, k = theta.shape
    V = orthonormal_basis(theta)
    lam = sign * psi * psi
    W_V = V.permute(1, 0, 2).reshape(d, heads * k)
    W_O = (lam.unsqueeze(-1) * V.transpose(-1, -2)).reshape(heads * k, d)
    return W_V, W_O


def head_products(theta: torch.Tensor, psi: torch.Tensor, sign: float) -> torch.Tensor:
    """``W_VO^h = V_h diag(s ψ_h²) V_hᵀ`` for every head.

    Returns
    -------
    Tensor, shape (H, d, d)
        Symmetric, with nonzero eigenvalues s·ψ_h² (where Θ_h has full column rank).
    """
    V = orthonormal_basis(theta)
    lam = sign * psi * psi
    return (V * lam.unsqueeze(-2)) @ V.transpose(-1, -2)
