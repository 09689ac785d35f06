"""Block-quantised n-bit weights (onnxruntime's ``com.microsoft`` ``MatMulNBits``), dequantised exactly.

``MatMulNBits(A, B, scales, zero_points?, g_idx?, bias?)`` with attributes ``K``, ``N``, ``bits`` and
``block_size`` computes ``Y = A @ Ŵᵀ (+ bias)`` for a weight ``Ŵ`` of shape (N, K) stored block-wise
along K: row n is cut into ``n_blocks = ceil(K / block_size)`` blocks, block j of row n has the
scale ``s[n, j]`` and the zero point ``z[n, j]``, and each entry is a ``bits``-bit code ``q``:

    Ŵ[n, k] = (q[n, k] − z[n, k // block_size]) · s[n, k // block_size].

``B`` is uint8 of shape (N, n_blocks, block_size · bits / 8) with the codes of a byte packed
low bits first; uint8 zero points are packed the same way, ``ceil(n_blocks · bits / 8)`` bytes per
row; floating zero points are stored one per block, unpacked; without zero points ``z = 2^(bits−1)``.
With at most 8-bit codes, integer zero points and a float32 or float16 scale, every ``Ŵ[n, k]`` is
exact in float64. The module follows the row-vector convention of :mod:`oversmooth.importers.weights`: the
weight returned is ``W = Ŵᵀ`` of shape (K, N), so that ``y = x @ W``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["NBITS", "dequantize_nbits", "unpack_codes"]

#: Code widths this module unpacks (the widths onnxruntime's MatMulNBits defines).
NBITS = (2, 4, 8)


def unpack_codes(packed: NDArray[np.uint8], bits: int, count: int) -> NDArray[np.int64]:
    """The first ``count`` codes of each row of ``packed`` (rows along the last axis), low bits first.

    Parameters
    ----------
    packed : (..., n_bytes) uint8 ndarray
    bits : int
        Code width, one of :data:`NBITS`.
    count : int
        Codes kept per row (``count <= n_bytes · 8 / bits``).

    Returns
    -------
    (..., count) int64 ndarray
    """
    if bits not in NBITS:
        raise ValueError(f"{bits}-bit codes are not defined; expected one of {NBITS}")
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    codes = (packed[..., :, None] >> shifts) & np.uint8((1 << bits) - 1)
    codes = codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)
    if codes.shape[-1] < count:
        raise ValueError(f"{packed.shape[-1]} bytes hold fewer than {count} {bits}-bit codes")
    return codes[..., :count].astype(np.int64)


def dequantize_nbits(
    codes: NDArray[np.uint8],
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    *,
    bits: int,
    block_size: int,
    K: int,
    N: int,
) -> NDArray[np.float64]:
    """The (K, N) float64 weight ``W = Ŵᵀ`` of a ``MatMulNBits`` node (see the module docstring).

    Parameters
    ----------
    codes : uint8 ndarray with N · n_blocks · block_size · bits / 8 entries
        Input ``B``.
    scales : float ndarray with N · n_blocks entries
    zero_points : uint8 ndarray with N · ceil(n_blocks · bits / 8) entries, float ndarray with
        N · n_blocks entries, or None
    bits, block_size, K, N : int
        The node's attributes.

    Raises
    ------
    ValueError
        When a size disagrees with the attributes.
    """
    n_blocks = -(-K // block_size)
    if block_size <= 0 or block_size * bits % 8:
        raise ValueError(f"block_size {block_size} does not hold whole bytes of {bits}-bit codes")
    blob = block_size * bits // 8
    if codes.size != N * n_blocks * blob:
        raise ValueError(
            f"B has {codes.size} bytes; expected N·n_blocks·blob = {N * n_blocks * blob}"
        )
    if scales.size != N * n_blocks:
        raise ValueError(f"scales has {scales.size} entries; expected N·n_blocks = {N * n_blocks}")
    q = unpack_codes(codes.reshape(N, n_blocks * blob), bits, n_blocks * block_size)
    q = q.reshape(N, n_blocks, block_size)
    scale = scales.astype(np.float64).reshape(N, n_blocks, 1)
    W = (q - _zero_points(zero_points, bits, N, n_blocks)) * scale
    return W.reshape(N, n_blocks * block_size)[:, :K].T


def _zero_points(zero_points: np.ndarray | None, bits: int, N: int, n_blocks: int) -> np.ndarray:
    """(N, n_blocks, 1) zero points: unpacked uint8, float as stored, or the default ``2^(bits−1)``."""
    if zero_points is None:
        return np.full((N, n_blocks, 1), 1 << (bits - 1), dtype=np.int64)
    if np.issubdtype(zero_points.dtype, np.floating):
        if zero_points.size != N * n_blocks:
            raise ValueError(f"zero_points has {zero_points.size} entries; expected {N * n_blocks}")
        return zero_points.astype(np.float64).reshape(N, n_blocks, 1)
    per_row = -(-n_blocks * bits // 8)
    if zero_points.size != N * per_row:
        raise ValueError(f"zero_points has {zero_points.size} bytes; expected {N * per_row}")
    packed = zero_points.astype(np.uint8).reshape(N, per_row)
    return unpack_codes(packed, bits, n_blocks).reshape(N, n_blocks, 1)
