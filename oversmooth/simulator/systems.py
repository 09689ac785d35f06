"""The fixed systems ``(A, W_V, W_proj, X0[, gamma, beta])`` that ``oversmooth simulate`` runs.

A system is read from an ``.npz`` archive of named arrays, drawn from a few synthetic options, or
saved for a later run. Only the structure is checked here (keys, numeric finite non-empty arrays,
ranks, and every size against :mod:`oversmooth.simulator.limits` before it is allocated: a member's declared
shape before its data is read, a drawn array's before it is drawn); the rule built on a system
checks that its sizes agree (:func:`oversmooth.simulator.updates.rule_from_system`).

Public API
----------
System
    The arrays of one system.
load_system, save_system
    Read and write a system ``.npz`` file.
draw_system
    A synthetic system: A of a chosen kind, a symmetric H with a chosen spectrum, Gaussian tokens.
REQUIRED_KEYS, OPTIONAL_KEYS, A_KINDS, H_SPECTRA
    The archive keys, the kinds of attention matrix and the named H spectra.
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from oversmooth.simulator.errors import InputError, one_line
from oversmooth.simulator.limits import check_elements
from oversmooth.simulator.npzfile import read_npy_data, read_npy_header
from oversmooth.simulator.output import atomic_output, npz_members
from oversmooth.simulator.spectra import (
    attention_doubly_stochastic,
    attention_general,
    attention_symmetric_scores,
    h_symmetric,
    random_tokens,
)
from oversmooth.simulator.validation import (
    FloatArray,
    as_float_array,
    check_choice,
    check_positive_int,
    regular_file,
)

__all__ = [
    "A_KINDS",
    "H_SPECTRA",
    "OPTIONAL_KEYS",
    "REQUIRED_KEYS",
    "System",
    "draw_system",
    "load_system",
    "save_system",
]

#: Keys a system archive must have.
REQUIRED_KEYS = ("A", "W_V", "W_proj", "X0")
#: Keys it may have (the LayerNorm parameters of ``pre-ln`` and ``post-ln``).
OPTIONAL_KEYS = ("gamma", "beta")
#: Kinds of synthetic attention matrix (:mod:`oversmooth.simulator.spectra`).
A_KINDS = ("symmetric", "doubly-stochastic", "general")
#: Named H spectra: eigenvalues drawn uniformly in these intervals (claims 9 and 10).
H_SPECTRA = {"negative": (-1.0, -0.05), "positive": (0.05, 1.0)}
#: What reading a damaged member of a system archive raises inside NumPy and zipfile.
_NPZ_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    KeyError,
    zipfile.BadZipFile,
    zlib.error,
    struct.error,
)
#: Rank of each array of a system file.
_NDIM = {"A": 2, "W_V": 2, "W_proj": 2, "X0": 2, "gamma": 1, "beta": 1}


@dataclass(frozen=True)
class System:
    """A fixed system: attention, weights, initial tokens and optional LayerNorm parameters.

    Attributes
    ----------
    A : (n, n) ndarray
        Attention matrix (a rule checks that it is row-stochastic).
    W_V : (d, d_v) ndarray
        Value weights.
    W_proj : (d_v, d) ndarray
        Output projection; ``W_V W_proj = M = H^T``.
    X0 : (n, d) ndarray
        Initial tokens.
    gamma, beta : (d,) ndarray or None
        LayerNorm weight and bias (used by ``pre-ln`` and ``post-ln`` only).
    """

    A: FloatArray
    W_V: FloatArray
    W_proj: FloatArray
    X0: FloatArray
    gamma: FloatArray | None = None
    beta: FloatArray | None = None

    def arrays(self) -> dict[str, FloatArray]:
        """The arrays to save, under their npz keys (None ones left out)."""
        present = {key: getattr(self, key) for key in (*REQUIRED_KEYS, *OPTIONAL_KEYS)}
        return {key: value for key, value in present.items() if value is not None}


# ----------------------------------------------------------------------------------------------
# system files
# ----------------------------------------------------------------------------------------------


def load_system(path: str | os.PathLike[str], *, label: str = "system") -> System:
    """Read and validate the arrays of a system file (structure only; the rule checks the rest).

    Parameters
    ----------
    path : path-like
        An ``.npz`` archive with the keys :data:`REQUIRED_KEYS` and optionally
        :data:`OPTIONAL_KEYS` (other keys are ignored).
    label : str
        How error messages name the file's argument (the command line passes ``--system``).

    Returns
    -------
    System
        Float64 arrays: ``A`` ``(n, n)``, ``W_V`` ``(d, d_v)``, ``W_proj`` ``(d_v, d)``, ``X0``
        ``(n, d)``, ``gamma`` and ``beta`` ``(d,)`` or None.

    Raises
    ------
    InputError
        The file is missing, not a regular file, not an npz archive, lacks a key, or holds an
        array that is not real, finite, non-empty and of the right rank, whose header cannot be
        parsed, or that declares more elements than :func:`oversmooth.simulator.limits.check_elements`
        allows (checked before its data is read).
    """
    shown = os.fspath(path)
    arrays, members = _read_npz(path, label)
    missing = [key for key in REQUIRED_KEYS if key not in arrays]
    if missing:
        raise InputError(
            f"`{label}` must contain the keys {', '.join(REQUIRED_KEYS)}; {shown!r} lacks "
            f"{', '.join(missing)} (has {', '.join(sorted(members)) or 'no arrays'})"
        )
    checked = {key: _array(value, key, shown, label) for key, value in arrays.items()}
    for key, ndim in _NDIM.items():
        if key in checked and checked[key].ndim != ndim:
            what = "a single 2-D matrix" if ndim == 2 else "a 1-D vector (one per feature)"
            raise InputError(
                f"`{key}` in {label} {shown!r} must be {what}; got shape {checked[key].shape}"
            )
        if key in checked and checked[key].size == 0:
            raise InputError(
                f"`{key}` in {label} {shown!r} must not be empty; got shape {checked[key].shape}"
            )
    return System(**checked)


def _read_npz(path: str | os.PathLike[str], label: str) -> tuple[dict[str, object], list[str]]:
    """The archive's arrays under the keys of :class:`System` (no other member is read), and the
    names of all its members. Each member's header is checked (:func:`_read_member`) before its
    data is read."""
    shown = os.fspath(path)
    file = regular_file(path, label)  # before opening: a pipe or a device is refused
    try:
        archive = zipfile.ZipFile(file)
    except OSError as err:
        raise InputError(
            f"`{label}` must be a readable .npz file; got {shown!r} ({err.strerror or err})"
        ) from None
    except (ValueError, EOFError, zipfile.BadZipFile):
        with open(file, "rb") as handle:
            npy = handle.read(6) == b"\x93NUMPY"
        what = (
            "an .npz archive of named arrays; got .npy data" if npy else "a NumPy .npz archive; got"
        )
        raise InputError(f"`{label}` must be {what} {shown!r}") from None
    known = {f.name for f in fields(System)}
    arrays: dict[str, object] = {}
    key = ""
    try:
        with archive:
            members = {name.removesuffix(".npy"): name for name in archive.namelist()}
            for key, name in members.items():
                if key in known:  # other keys are ignored, so never read
                    arrays[key] = _read_member(archive, name, key, shown, label)
    except InputError:
        raise
    except _NPZ_ERRORS as err:
        raise InputError(
            f"`{label}` must hold plain numeric arrays; {shown!r} has an unreadable entry "
            f"{key!r} ({type(err).__name__}: {one_line(err)[:160]})"
        ) from None
    return arrays, list(members)


def _read_member(archive: zipfile.ZipFile, name: str, key: str, shown: str, label: str) -> object:
    """Member ``name``'s array: its ``.npy`` header is read first, and the size it declares must be
    within :func:`oversmooth.simulator.limits.check_elements` and held by the member before any data is read."""
    info = archive.getinfo(name)
    with archive.open(info) as handle:
        shape, fortran, dtype = read_npy_header(handle)
        check_elements(shape, f"{key} in {label} {shown!r}")
        declared = math.prod(shape) * dtype.itemsize
        if info.file_size != handle.tell() + declared:
            raise InputError(
                f"`{key}` in {label} {shown!r} declares shape {shape} of {dtype} "
                f"({declared:,} bytes) but holds {info.file_size - handle.tell():,} bytes"
            )
        return read_npy_data(handle, shape, fortran, dtype)


def _array(value: object, key: str, shown: str, label: str) -> FloatArray:
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        kind = getattr(value, "dtype", type(value).__name__)
        raise InputError(f"`{key}` in {label} {shown!r} must be a real numeric array; got {kind}")
    try:
        return as_float_array(value, key)
    except InputError as err:
        raise InputError(f"{err} (in {label} {shown!r})") from None


def is_system_file(path: Path) -> bool:
    """Whether ``path`` is an earlier system archive (its arrays are system keys only)."""
    members = npz_members(path)
    return members is not None and bool(members) and members <= set(System.__dataclass_fields__)


def save_system(
    path: str | os.PathLike[str], system: System, *, label: str = "output", force: bool = False
) -> Path:
    """Write ``system`` as an ``.npz`` archive that :func:`load_system` reads back.

    Parameters
    ----------
    path : path-like
        Destination, written atomically (:func:`oversmooth.simulator.output.atomic_output`).
    system : System
    label : str
        How error messages name the destination's argument.
    force : bool
        Replace an existing file whatever it holds; by default only an earlier system archive.

    Returns
    -------
    pathlib.Path
    """
    # Not savez's allow_pickle keyword (NumPy 2.1+; older versions would store it as an array), so
    # the arrays are typed loosely: the stub checks every **kwds value against allow_pickle: bool.
    named: dict[str, Any] = system.arrays()
    with atomic_output(path, "wb", label=label, ours=None if force else is_system_file) as handle:
        np.savez(handle, **named)
    return Path(path)


# ----------------------------------------------------------------------------------------------
# synthetic systems
# ----------------------------------------------------------------------------------------------


def _h_interval(spec: str, label: str) -> tuple[float, float]:
    if spec in H_SPECTRA:
        return H_SPECTRA[spec]
    parts = spec.split(":")
    try:
        if len(parts) != 3 or parts[0] != "uniform":
            raise ValueError
        low, high = float(parts[1]), float(parts[2])
    except ValueError:
        raise InputError(
            f"`{label}` must be negative, positive or uniform:LOW:HIGH; got {spec!r}"
        ) from None
    if not (np.isfinite(low) and np.isfinite(high) and low <= high):
        raise InputError(f"`{label}` must have finite LOW <= HIGH; got {spec!r}")
    return low, high


def draw_system(
    *,
    n: int,
    d: int,
    a_kind: str,
    h_spectrum: str,
    scale: float,
    seed: int,
    gamma: float | None = None,
    labels: Mapping[str, str] | None = None,
) -> System:
    """Draw a synthetic system with a chosen attention kind and H spectrum.

    ``A`` is drawn by :mod:`oversmooth.simulator.spectra` for ``a_kind``; ``H = Q diag(lambda) Q^T`` with
    lambda uniform in the H spectrum's interval; ``W_V = I`` and ``W_proj = H^T`` (so
    ``W_V W_proj = M = H^T``); ``X0 ~ N(0, 1)``.

    Parameters
    ----------
    n : int
        Tokens, at least 2.
    d : int
        Features, positive.
    a_kind : {"symmetric", "doubly-stochastic", "general"}
    h_spectrum : str
        ``negative``, ``positive`` (:data:`H_SPECTRA`) or ``uniform:LOW:HIGH``.
    scale : float
        Attention logit scale, finite.
    seed : int
        Non-negative seed of the one generator every array is drawn from.
    gamma : float, optional
        A uniform LayerNorm weight ``gamma = (gamma, ..., gamma)``, either sign.
    labels : mapping of str to str, optional
        How error messages name each parameter (default its own name; the command line passes
        its option names, e.g. ``{"n": "--n", "h_spectrum": "--h-spectrum"}``).

    Returns
    -------
    System
        ``A`` ``(n, n)``, ``W_V`` ``(d, d)``, ``W_proj`` ``(d, d)``, ``X0`` ``(n, d)``, ``gamma``
        ``(d,)`` or None, ``beta`` None.
    """
    names = dict(labels or {})
    label = {
        key: names.get(key, key) for key in ("n", "d", "a_kind", "h_spectrum", "scale", "seed")
    }
    n = check_positive_int(n, label["n"])
    d = check_positive_int(d, label["d"])
    if n < 2:
        raise InputError(f"`{label['n']}` must be at least 2 (tokens); got {n}")
    # every array drawn below, checked before any is allocated
    check_elements((n, n), f"A of {label['n']} {n}")
    check_elements((n, d), f"X0 of {label['n']} {n} and {label['d']} {d}")
    check_elements((d, d), f"H of {label['d']} {d}")
    check_choice(a_kind, label["a_kind"], A_KINDS)
    low, high = _h_interval(h_spectrum, label["h_spectrum"])
    if not np.isfinite(scale):
        raise InputError(f"`{label['scale']}` must be finite; got {scale!r}")
    if seed < 0:
        raise InputError(f"`{label['seed']}` must be a non-negative integer; got {seed!r}")
    rng = np.random.default_rng(seed)
    draw_a = {
        "symmetric": attention_symmetric_scores,
        "doubly-stochastic": attention_doubly_stochastic,
        "general": attention_general,
    }[a_kind]
    try:
        with np.errstate(over="raise", invalid="raise"):  # no raw RuntimeWarning reaches the user
            A = draw_a(n, scale=scale, rng=rng)
    except FloatingPointError:
        raise InputError(
            f"`{label['scale']}` must keep the attention logits finite in float64; {scale!r} "
            f"overflows"
        ) from None
    H = h_symmetric(rng.uniform(low, high, d), rng=rng)
    X0 = random_tokens(n, d, rng=rng)
    g = None if gamma is None else np.full(d, float(gamma))
    return System(A=A, W_V=np.eye(d), W_proj=H.T.copy(), X0=X0, gamma=g)
