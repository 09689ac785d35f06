"""Errors raised by the ONNX importer.

Every class derives from :class:`simulator.errors.OversmoothError`, so the ``oversmooth`` command turns
it into a one-line message and its ``exit_code`` (2 for a bad model file, 1 when a well-formed model has
no recognisable attention block).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from simulator.errors import OversmoothError

if TYPE_CHECKING:
    from importers.patterns import MatchFailure

__all__ = [
    "ExternalDataError",
    "ExtractionError",
    "ImporterError",
    "ModelFileError",
    "NoAttentionBlocksError",
    "UnsupportedModelError",
]


class ImporterError(OversmoothError):
    """Base class of the importer's errors (exit status 2 unless a subclass says otherwise)."""


class ModelFileError(ImporterError, ValueError):
    """The file is missing, is not ONNX, or is truncated or internally inconsistent."""


class UnsupportedModelError(ImporterError, ValueError):
    """A well-formed ONNX model this importer does not handle (e.g. an opset outside its range)."""


class ExternalDataError(ImporterError, ValueError):
    """An external-data tensor points outside the model's folder, or its file is missing or short."""


class ExtractionError(ImporterError, ValueError):
    """A matched block's weights could not be read (wrong size, unsupported encoding)."""


class NoAttentionBlocksError(ImporterError):
    """No Softmax in the graph matched the attention pattern.

    Attributes
    ----------
    failures : tuple of MatchFailure
        One entry per rejected Softmax candidate (empty when the graph has no Softmax at all).
    """

    exit_code = 1

    def __init__(self, message: str, failures: Sequence[MatchFailure] = ()) -> None:
        super().__init__(message)
        self.failures = tuple(failures)

    @classmethod
    def from_failures(
        cls, failures: Sequence[MatchFailure], *, top: int = 3, fused: Sequence[str] = ()
    ) -> NoAttentionBlocksError:
        """Build the error with a message naming the ``top`` most common rejection reasons.

        ``fused`` lists fused attention op types found instead of a Softmax (not supported).
        """
        if not failures:
            extra = (
                f" (it uses fused {', '.join(sorted(set(fused)))} nodes, which hide the attention "
                f"weights' structure; export without attention fusion)"
                if fused
                else ""
            )
            return cls(f"no attention block found: the graph has no Softmax node{extra}", ())
        counts = Counter(failure.code for failure in failures)
        example = {}
        for failure in failures:
            example.setdefault(failure.code, failure)
        parts = []
        for code, count in counts.most_common(top):
            times = f" (x{count})" if count > 1 else ""
            parts.append(f"Softmax {example[code].softmax!r}: {example[code].reason}{times}")
        return cls(
            f"no attention block found among {len(failures)} Softmax node(s); "
            f"most common reasons: {'; '.join(parts)}",
            failures,
        )
