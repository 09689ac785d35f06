"""The importer's error hierarchy (importers.errors), class by class as its docstring draws it:
every error is an ImporterError and an OversmoothError, bad input is also an InputError (exit 2),
and the four errors of a well-formed model the importer cannot audit exit 1."""

from __future__ import annotations

import pytest

from oversmooth.importers import errors
from oversmooth.importers.errors import (
    ClusterError,
    ExternalDataError,
    ExtractionError,
    FeedError,
    FetchError,
    ImporterError,
    ImporterInputError,
    LayerStreamError,
    MissingDependencyError,
    ModelChangedError,
    ModelFileError,
    ModelMissingError,
    NonFiniteModelError,
    ProviderError,
    RunnerError,
    TransformError,
    UnknownModelError,
    UnsupportedModelError,
)
from oversmooth.importers.match import NoAttentionBlocksError
from oversmooth.simulator.errors import InputError, OversmoothError

#: Per class: its parent in the docstring's hierarchy, the built-in it also is (or None), its exit
#: status.
HIERARCHY: dict[type[Exception], tuple[type[Exception], type[Exception] | None, int]] = {
    ImporterInputError: (ImporterError, InputError, 2),
    UnknownModelError: (ImporterInputError, InputError, 2),
    FeedError: (ImporterInputError, InputError, 2),
    ModelFileError: (ImporterError, ValueError, 2),
    UnsupportedModelError: (ImporterError, ValueError, 2),
    ExternalDataError: (ImporterError, ValueError, 2),
    ExtractionError: (ImporterError, ValueError, 2),
    TransformError: (ImporterError, ValueError, 2),
    LayerStreamError: (ImporterError, None, 1),
    NonFiniteModelError: (ImporterError, None, 1),
    ModelMissingError: (ImporterError, None, 2),
    ModelChangedError: (ImporterError, None, 2),
    FetchError: (ImporterError, None, 2),
    RunnerError: (ImporterError, None, 2),
    ProviderError: (RunnerError, None, 2),
    ClusterError: (ImporterError, None, 1),
    MissingDependencyError: (ImporterError, ImportError, 2),
    NoAttentionBlocksError: (ImporterError, None, 1),
}


@pytest.mark.parametrize("cls", HIERARCHY, ids=lambda cls: cls.__name__)
def test_each_error_has_its_documented_parents_and_exit_status(cls: type[Exception]) -> None:
    parent, builtin, exit_code = HIERARCHY[cls]
    assert issubclass(cls, parent)
    assert issubclass(cls, OversmoothError)
    if builtin is not None:
        assert issubclass(cls, builtin)
    assert cls.exit_code == exit_code  # type: ignore[attr-defined]


def test_only_bad_input_is_an_input_error() -> None:
    inputs = {cls for cls in HIERARCHY if issubclass(cls, InputError)}
    assert inputs == {ImporterInputError, UnknownModelError, FeedError}


def test_the_table_covers_every_exported_error() -> None:
    exported = {getattr(errors, name) for name in errors.__all__}
    assert exported - {ImporterError} == set(HIERARCHY) - {NoAttentionBlocksError}


def test_an_error_keeps_its_message() -> None:
    err = FeedError("feed 'input_ids' must be int64; got float32")
    assert str(err) == "feed 'input_ids' must be int64; got float32"
    with pytest.raises(ImporterError, match="input_ids"):
        raise err
