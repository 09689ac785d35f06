"""The QR parametrisation V_h diag(±ψ_h²) V_hᵀ: smooth, sign-exact, and what the model does with it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip(
    "torch", reason="needs the train extra: pip install 'oversmooth[train]'"
)

from oversmooth.training.parametrisation import (  # noqa: E402
    head_products,
    orthonormal_basis,
    value_output,
)


def test_qr_basis_is_orthonormal_with_positive_r_diagonal():
    theta = torch.randn(3, 10, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    V = orthonormal_basis(theta)
    torch.testing.assert_close(
        V.transpose(-1, -2) @ V, torch.eye(4, dtype=torch.float64).expand(3, 4, 4)
    )
    R = V.transpose(-1, -2) @ theta  # Θ = V R
    torch.testing.assert_close(V @ R, theta)
    assert torch.all(torch.diagonal(R, dim1=-2, dim2=-1) > 0)
    # the convention is what makes it a function of Θ: flipping a column of Θ flips V's column
    flipped = theta.clone()
    flipped[:, :, 1] *= -1
    torch.testing.assert_close(orthonormal_basis(flipped)[:, :, 1], -V[:, :, 1])


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradcheck_of_the_head_products(sign):
    generator = torch.Generator().manual_seed(1)
    theta = torch.randn(2, 6, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    psi = torch.randn(2, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, p: head_products(t, p, sign), (theta, psi))
    assert torch.autograd.gradcheck(lambda t, p: value_output(t, p, sign), (theta, psi))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_factors_multiply_to_the_symmetric_head_products(sign):
    generator = torch.Generator().manual_seed(2)
    theta = torch.randn(4, 16, 4, generator=generator, dtype=torch.float64)
    psi = torch.randn(4, 4, generator=generator, dtype=torch.float64)
    W_V, W_O = value_output(theta, psi, sign)
    products = head_products(theta, psi, sign)
    for h in range(4):
        torch.testing.assert_close(W_V[:, 4 * h : 4 * h + 4] @ W_O[4 * h : 4 * h + 4], products[h])
    torch.testing.assert_close(products, products.transpose(-1, -2))
    values = torch.linalg.eigvalsh(products)  # ascending: 12 zeros and s·ψ²
    nonzero = values[:, -4:] if sign > 0 else values[:, :4]
    torch.testing.assert_close(nonzero.sort().values, (sign * psi**2).sort().values)
    torch.testing.assert_close(
        values.abs().sort().values[:, :12], torch.zeros(4, 12, dtype=torch.float64)
    )
