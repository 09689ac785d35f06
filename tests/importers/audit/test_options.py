"""Every option of an audit, checked once (importers.audit.options): the documented defaults, each
refusal by name, and how many prefix tokens leave the metrics."""

from __future__ import annotations

import numpy as np
import pytest

from oversmooth.importers.audit.options import AuditOptions
from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.zoo import get_model
from oversmooth.simulator.tolerances import TIE_RTOL


def test_operator_inputs_must_be_positive() -> None:
    from oversmooth.importers.errors import ImporterInputError

    with pytest.raises(ImporterInputError, match="operator_inputs"):
        AuditOptions(dominance="operator", operator_inputs=0)


def test_the_documented_defaults() -> None:
    options = AuditOptions()
    assert (options.provider, options.dominance, options.h) == ("auto", "head", "effective")
    assert (options.batch_size, options.operator_inputs, options.depth_inputs) == (4, 2, 1)
    assert options.dominance_inputs == "auto"
    flags = ("spectral", "spectral_norm", "partial", "progress", "cache")
    assert {flag: getattr(options, flag) for flag in flags} == {
        "spectral": True,
        "spectral_norm": False,
        "partial": False,
        "progress": False,
        "cache": True,
    }
    assert options.exclude_prefix is False
    assert options.threads is None
    assert options.tie_rtol == TIE_RTOL


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"dominance": "all"},
            r"`dominance` must be one of head, layer, operator, operating, none",
        ),
        ({"h": "dense"}, r"`h` must be one of effective, stored; got 'dense'"),
        ({"batch_size": 0}, r"`batch_size` must be a positive integer; got 0"),
        ({"depth_inputs": -1}, r"`depth_inputs` must be a positive integer"),
        ({"threads": 0}, r"`threads` must be a positive integer"),
        ({"threads": True}, r"`threads` must be a positive integer"),
        ({"spectral": False, "spectral_norm": True}, r"`spectral_norm` needs the Gram matrices"),
        (
            {"exclude_prefix": -1},
            r"`exclude_prefix` must be a bool or a non-negative integer; got -1",
        ),
        ({"exclude_prefix": 1.5}, r"`exclude_prefix` must be a bool or a non-negative integer"),
        ({"exclude_prefix": "1"}, r"`exclude_prefix` must be a bool or a non-negative integer"),
    ],
)
def test_a_bad_option_is_refused_by_name(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ImporterInputError, match=message):
        AuditOptions(**changes)  # type: ignore[arg-type]


def test_threads_and_a_numpy_integer_prefix_are_accepted() -> None:
    options = AuditOptions(threads=3, exclude_prefix=np.int64(2))
    assert options.threads == 3
    assert options.prefix_count(None) == 2


@pytest.mark.parametrize(
    ("exclude_prefix", "zoo", "expected"),
    [
        (False, None, 0),
        (False, "dinov2-vits14", 0),
        (True, None, 1),  # a model outside the zoo: one CLS token
        (True, "dinov2-vits14", 1),
        (True, "minilm-l3", 0),  # the zoo's own count
        (3, "dinov2-vits14", 3),  # a count overrides the zoo
        (0, None, 0),
    ],
)
def test_the_prefix_count_follows_the_option_then_the_zoo(
    exclude_prefix: bool | int, zoo: str | None, expected: int
) -> None:
    entry = None if zoo is None else get_model(zoo)
    count = AuditOptions(exclude_prefix=exclude_prefix).prefix_count(entry)
    assert count == expected
    assert type(count) is int
