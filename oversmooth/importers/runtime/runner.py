"""Run an ONNX model with onnxruntime and fetch chosen intermediate tensors, batch by batch.

ONNX Runtime can only return graph outputs, so :class:`Runner` appends the requested tensors, and
the outputs of an optional :class:`~oversmooth.importers.runtime.reductions.GraphExtension` (nodes it adds, e.g. the
audit's reductions), to the graph's outputs (typed by ONNX shape inference where it can, else by
onnxruntime) and, unless asked, drops the original outputs so only those are copied back. Note that
onnxruntime does not fuse across a node whose output is a graph output, so an instrumented session
runs a slightly different (less fused) graph than the plain one (see :func:`plain_session`).

Provider choice is explicit and checked against what the session actually runs
(``session.get_providers()``), never against what the build merely lists: ``"cuda"`` fails loudly
when CUDA cannot be used, ``"auto"`` falls back to the CPU and records why.

onnxruntime is imported lazily, inside the functions that need it.

Public API
----------
Runner
    A session exposing chosen tensors; ``run`` yields them per batch, ``provenance`` records options.
plain_session
    An onnxruntime session of the unmodified graph with the same options (for benchmarks).
session_options, open_session
    The options every session here uses; a session on a provider, with the note on the choice.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from oversmooth.importers.defaults import PROVIDERS as PROVIDERS
from oversmooth.importers.defaults import Provider as Provider
from oversmooth.importers.errors import ImporterInputError, ProviderError, RunnerError
from oversmooth.importers.graph import GraphInput, OnnxModel
from oversmooth.importers.graph.index import uses_external_data
from oversmooth.importers.inputs.feeds import Inputs, check_feeds
from oversmooth.importers.runtime.batching import (
    OnePerCall,
    batch_count,
    call_size,
    calls,
    drop_filler,
    fixed_batch,
)
from oversmooth.importers.runtime.binding import BoundOutputs
from oversmooth.importers.runtime.cuda import device_arrays, preload_cuda_libraries
from oversmooth.importers.runtime.graph_edits import (
    LateOutputs,
    instrumented,
    optimised_model_path,
    optimised_with_late,
    temporary_model_file,
)
from oversmooth.importers.runtime.reductions import GraphExtension
from oversmooth.importers.zoo import file_sha256

__all__ = [
    "OPTIMIZATION_LEVELS",
    "PROVIDERS",
    "Runner",
    "open_session",
    "plain_session",
    "session_options",
]

Optimization = Literal["disable", "basic", "extended", "all"]

OPTIMIZATION_LEVELS: tuple[str, ...] = ("disable", "basic", "extended", "all")

_CPU = "CPUExecutionProvider"
_CUDA = "CUDAExecutionProvider"
#: CUDA provider options: full float32 matrix products (TF32 would round their inputs to 10 bits
#: of mantissa, so a GPU audit would measure a different model than the exported float32 one).
CUDA_OPTIONS = {"use_tf32": "0"}
_ORT_LEVEL_NAMES = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
#: Session config entries set on every session (spinning thread pools fight over few cores).
_CONFIG_ENTRIES = {
    "session.intra_op.allow_spinning": "0",
    "session.inter_op.allow_spinning": "0",
}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Why the CUDA provider could not be created earlier in this process (empty: not tried/worked).
_CUDA_FAILURE: list[str] = []


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise RunnerError(
            "running models needs onnxruntime; install `onnxruntime` (or `onnxruntime-gpu`)"
        ) from err
    # Warnings never; errors are captured around session creation and silenced while running.
    onnxruntime.set_default_logger_severity(3)
    return onnxruntime


def default_threads() -> int:
    """CPU cores this process may use (``sched_getaffinity``), else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class _Options:
    threads: int
    optimization: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "intra_op_num_threads": self.threads,
            "inter_op_num_threads": 1,
            "execution_mode": "sequential",
            "graph_optimization_level": _ORT_LEVEL_NAMES[self.optimization],
            **_CONFIG_ENTRIES,
        }


def _check_options(threads: int | None, optimization: str) -> _Options:
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0
    ):
        raise ImporterInputError(f"`threads` must be a positive integer or None; got {threads!r}")
    if optimization not in OPTIMIZATION_LEVELS:
        raise ImporterInputError(
            f"`optimization` must be one of {', '.join(OPTIMIZATION_LEVELS)}; got {optimization!r}"
        )
    return _Options(threads or default_threads(), optimization)


def session_options(threads: int | None = None, optimization: Optimization = "all") -> Any:
    """Return ``onnxruntime.SessionOptions`` as every session here uses them.

    Explicit intra-op threads (default: the usable cores), one inter-op thread, sequential
    execution, thread-pool spinning off, the given graph optimisation level, warnings not logged.
    """
    options = _check_options(threads, optimization)
    ort = _ort()
    so = ort.SessionOptions()
    so.intra_op_num_threads = options.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, _ORT_LEVEL_NAMES[options.optimization]
    )
    # Errors while creating a session are captured (the CUDA provider's reason is read from them);
    # run-time errors are silenced through RunOptions, see Runner.
    so.log_severity_level = 3
    for key, value in _CONFIG_ENTRIES.items():
        so.add_session_config_entry(key, value)
    return so


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Capture what native code writes to file descriptor 2 (onnxruntime's provider errors).

    onnxruntime reports a CUDA provider that cannot be created on stderr and carries on with the
    CPU; capturing it keeps the library silent and lets the reason be reported.
    """
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode("utf-8", "replace").splitlines())


def cuda_failure_reason(lines: Sequence[str]) -> str:
    """The most specific reason in onnxruntime's log for a CUDA provider it could not create."""
    clean = [_ANSI.sub("", line).strip() for line in lines]
    for line in clean:
        if "Failed to load library" in line and "with error:" in line:
            return line.split("with error:", 1)[1].strip()
    for line in clean:
        if "CUDA" in line:
            return line.split("] ", 1)[-1].strip()
    return "onnxruntime gave no reason"


def _create(ort: Any, model: bytes | str, so: Any, providers: list[Any]) -> tuple[Any, list[str]]:
    with _captured_stderr() as log:
        try:
            session = ort.InferenceSession(model, sess_options=so, providers=providers)
        except Exception as err:  # onnxruntime raises its own untyped exceptions
            raise RunnerError(f"onnxruntime could not load the model: {err}") from err
    return session, log


def _open_session(ort: Any, model: bytes | str, so: Any, provider: str) -> tuple[Any, str]:
    """Create a session on the requested provider; return it and a note on the choice."""
    available = ort.get_available_providers()
    if provider == "cpu":
        return _create(ort, model, so, [_CPU])[0], "cpu requested"
    if _CUDA not in available:
        note = f"this onnxruntime build has no {_CUDA} (available: {', '.join(available)})"
        if provider == "cuda":
            raise ProviderError(f"`provider` cuda cannot be used: {note}")
        return _create(ort, model, so, [_CPU])[0], f"{note}; using the CPU"
    if provider == "auto" and _CUDA_FAILURE:
        # The provider library failed to load earlier in this process; it will not load now.
        return _create(ort, model, so, [_CPU])[0], f"{_CUDA_FAILURE[0]}; using the CPU"
    preload_cuda_libraries(ort)  # the nvidia-* wheels of `oversmooth[gpu]`, when installed
    try:
        session, log = _create(ort, model, so, [(_CUDA, dict(CUDA_OPTIONS)), _CPU])
    except RunnerError as err:
        if provider == "cuda":
            raise ProviderError(f"`provider` cuda cannot be used: {err}") from err
        return _create(ort, model, so, [_CPU])[0], f"{_CUDA} failed ({err}); using the CPU"
    if _CUDA in session.get_providers():
        return session, f"{_CUDA} created"
    reason = f"{_CUDA} is listed but could not be created: {cuda_failure_reason(log)}"
    _CUDA_FAILURE[:] = [reason]
    if provider == "cuda":
        raise ProviderError(f"`provider` cuda requested but the session runs on the CPU; {reason}")
    return session, f"{reason}; using the CPU"


def open_session(
    model: bytes, provider: Provider = "auto", *, threads: int | None = None
) -> tuple[Any, str]:
    """An onnxruntime session of a serialized model on ``provider``, and the note on the choice.

    ``"cuda"`` raises :class:`~oversmooth.importers.errors.ProviderError` unless the session really runs on
    CUDA (what ``oversmooth doctor`` tries); ``"auto"`` falls back to the CPU with the reason.
    """
    so = session_options(threads)
    return _open_session(_ort(), model, so, _check_provider(provider))


def _check_provider(provider: str) -> str:
    if provider not in PROVIDERS:
        raise ImporterInputError(
            f"`provider` must be one of {', '.join(PROVIDERS)}; got {provider!r}"
        )
    return provider


def _tensor_names(model: Any) -> list[str]:
    names = [output for node in model.graph.node for output in node.output if output]
    return list(dict.fromkeys(names))


def _check_exposed(expose: Sequence[str], model: Any) -> list[str]:
    if isinstance(expose, str):
        raise ImporterInputError(
            f"`expose` must be a list of tensor names; got the string {expose!r}"
        )
    wanted = list(dict.fromkeys(expose))
    known = set(_tensor_names(model))
    for name in wanted:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f" (closest: {', '.join(close)})" if close else ""
            raise ImporterInputError(
                f"`expose` must name node outputs of the model; got {name!r}, which no node "
                f"produces{hint}"
            )
    return wanted


class Runner:
    """An onnxruntime session that returns chosen intermediate tensors of a model.

    Parameters
    ----------
    model : OnnxModel
        From :func:`oversmooth.importers.graph.load_model` (external data next to its file is supported). The
        session runs :meth:`~oversmooth.importers.graph.OnnxModel.session_model` (a model older than opset 13
        as it was read, not the conversion the importer reads); its graph is not changed: the
        exposed outputs are added to a serialized copy.
    expose : sequence of str
        Node output names to return (e.g. LayerNorm or residual ``Add`` outputs). Keep it to
        block-boundary tensors: every exposed ``(B, T, D)`` tensor is copied back per batch.
    provider : {"auto", "cpu", "cuda"}
        ``"cuda"`` raises :class:`ProviderError` unless the session really runs on CUDA;
        ``"auto"`` uses CUDA when a CUDA session can be created, else the CPU (see
        :attr:`provider_note`).
    threads : int, optional
        Intra-op threads (default: the usable CPU cores).
    include_outputs : bool
        Also return the model's original outputs.
    extension : GraphExtension, optional
        Nodes, constants and inputs appended to the graph for this session (e.g. the in-graph
        metric reductions of :mod:`oversmooth.importers.runtime.reductions`); its outputs come first, its inputs
        are fed like the model's own.
    optimization : {"disable", "basic", "extended", "all"}
        onnxruntime graph optimisation level.
    device_outputs : sequence of str
        Outputs to leave on the GPU when the session runs on CUDA and CuPy sees the GPU
        (:func:`~oversmooth.importers.runtime.cuda.device_arrays`): :meth:`run` yields them as CuPy arrays over
        onnxruntime's own device buffers, never copied. Ignored on the CPU (NumPy arrays).
    late : LateOutputs, optional
        Tensors read from the graph onnxruntime optimised, so that reading them changes no fusion
        (:mod:`~oversmooth.importers.runtime.graph_edits`): their extension's outputs come last
        (:attr:`late_outputs`), and the outputs it replaces are no longer returned
        (:attr:`GraphExtension.replaces`). Not for a model with external data (none are read).

    Attributes
    ----------
    output_names : list of str
        Names of the arrays :meth:`run` yields, in order.
    inputs : tuple of GraphInput
        The inputs to feed: the model's, then the extension's.
    provider_used : list of str
        ``session.get_providers()``: what onnxruntime actually runs.
    provider_note : str
        Why this provider was chosen.
    on_device : frozenset of str
        The outputs :meth:`run` yields on the GPU (empty on the CPU or without CuPy).
    late_outputs : list of str
        The outputs of ``late``'s extension, last in :attr:`output_names` (empty without it).
    late_read, late_unread : list of str
        ``late``'s wanted tensors found in the optimised graph (their names there), and those not
        found (all of them for a model with external data).
    one_per_call : OnePerCall
        Its ``note`` says why inputs run one per call (a batch fixed inside the graph), else "".
    """

    def __init__(
        self,
        model: OnnxModel,
        *,
        expose: Sequence[str],
        provider: Provider = "auto",
        threads: int | None = None,
        include_outputs: bool = False,
        extension: GraphExtension | None = None,
        optimization: Optimization = "all",
        device_outputs: Sequence[str] = (),
        late: LateOutputs | None = None,
    ) -> None:
        self.model_path = model.path
        self.provider = _check_provider(provider)
        self._options = _check_options(threads, optimization)
        proto = model.session_model()  # as read, where the importer reads a conversion
        exposed = _check_exposed(expose, proto)
        extension = extension or GraphExtension()
        if not exposed and not include_outputs and not extension.outputs:
            raise ImporterInputError(
                "`expose` must name at least one tensor when include_outputs=False"
            )
        self.inputs: tuple[GraphInput, ...] = model.inputs + extension.graph_inputs
        self._model_inputs = frozenset(spec.name for spec in model.inputs)
        self.exposed = exposed
        self.include_outputs = include_outputs
        ort = _ort()
        self._ort_version = ort.__version__
        so = session_options(self._options.threads, self._options.optimization)  # type: ignore[arg-type]
        external = uses_external_data(proto.graph)
        serialized = b""
        with instrumented(proto, exposed, include_outputs, extension) as names:
            self.output_names = names
            if external:  # onnxruntime resolves the data files next to a temporary copy
                if model.path is None:
                    raise RunnerError(
                        "a model with external data needs its folder; got an in-memory model"
                    )
                with temporary_model_file(proto, model.path.parent) as tmp:
                    self.session, self.provider_note = _open_session(ort, tmp, so, self.provider)
            else:
                serialized = proto.SerializeToString()
        self.late_outputs: list[str] = []
        self.late_unread: list[str] = list(late.sums) if late is not None else []
        self.late_read: list[str] = []
        if not external:  # the caller's graph has its own outputs back before onnxruntime parses
            with optimised_model_path() if late else contextlib.nullcontext("") as saved:
                if saved:
                    so.optimized_model_filepath = saved
                self.session, self.provider_note = _open_session(ort, serialized, so, self.provider)
                del serialized
                if late is not None:
                    self._reopen_with_late(ort, saved, late)
        # A failing kernel would log an [E:onnxruntime...] line before our one-line error.
        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = 4
        self.provider_used: list[str] = list(self.session.get_providers())
        self._on_cuda = self.provider_used[0] == _CUDA
        wanted = [name for name in self.output_names if name in set(device_outputs)]
        keep = self._on_cuda and bool(wanted) and device_arrays() is not None
        self.on_device: frozenset[str] = frozenset(wanted if keep else ())
        self.one_per_call = OnePerCall()
        self._bound = BoundOutputs(
            self.session,
            self.output_names,
            self._run_options,
            self._on_cuda,
            self.on_device,
            ort.OrtValue,
        )

    def _reopen_with_late(self, ort: Any, saved: str, late: LateOutputs) -> None:
        """The session again, on the graph onnxruntime optimised and saved at ``saved`` with
        ``late``'s tensors read there (:func:`~oversmooth.importers.runtime.graph_edits.
        optimised_with_late`), optimisation off, on the provider the first one used."""
        model, extension, found = optimised_with_late(saved, late)
        self.late_outputs = extension.output_names
        self.late_read = [name for name in found if name is not None]
        self.late_unread = [want for want, name in zip(late.sums, found, strict=True) if not name]
        plain = session_options(self._options.threads, "disable")
        provider = "cuda" if self.session.get_providers()[0] == _CUDA else "cpu"
        self.session = _open_session(ort, model.SerializeToString(), plain, provider)[0]
        replaced = set(extension.replaces)
        kept = [name for name in self.output_names if name not in replaced]
        self.output_names = [*kept, *self.late_outputs]

    def provenance(self) -> dict[str, Any]:
        """Every choice that affects the numbers: model, outputs, provider and session options."""
        return {
            "model": None if self.model_path is None else str(self.model_path),
            "model_sha256": None if self.model_path is None else file_sha256(self.model_path),
            "exposed": list(self.exposed),
            "include_outputs": self.include_outputs,
            "provider_requested": self.provider,
            "provider_used": list(self.provider_used),
            "provider_note": self.provider_note,
            "io_binding": self._on_cuda,
            "kept_on_device": sorted(self.on_device),
            "provider_options": self.session.get_provider_options().get(self.provider_used[0], {}),
            "onnxruntime": self._ort_version,
            "session_options": self._options.as_dict(),
            "one_input_per_call": self.one_per_call.note or None,
            "read_after_optimisation": list(self.late_read),
            "not_found_after_optimisation": list(self.late_unread),
        }

    def _feeds(self, feeds: Inputs | Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = dict(feeds.feeds if isinstance(feeds, Inputs) else feeds)
        check_feeds(arrays, self.inputs, any_batch=True)  # a fixed batch size: filled per call
        return {name: np.ascontiguousarray(array) for name, array in arrays.items()}

    def _run_batch(self, feeds: Mapping[str, np.ndarray], reuse: int) -> dict[str, np.ndarray]:
        if self._on_cuda or reuse:
            outputs = self._run_bound(feeds, reuse)
        else:
            outputs = self.session.run(self.output_names, dict(feeds), self._run_options)
        return dict(zip(self.output_names, outputs, strict=True))

    def _run_bound(self, feeds: Mapping[str, np.ndarray], reuse: int) -> list[Any]:
        """IOBinding (:class:`~oversmooth.importers.runtime.binding.BoundOutputs`): on CUDA, inputs copied to the
        GPU once, intermediates never leaving it, :attr:`on_device` outputs kept there."""
        return self._bound.run(feeds, reuse)

    def run(
        self,
        feeds: Inputs | Mapping[str, np.ndarray],
        *,
        batch_size: int | None = None,
        progress: bool = False,
        reuse_outputs: int = 0,
        first_item: int = 0,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Yield, per batch of items, ``{name: array}`` for every name in :attr:`output_names`.

        Feeds are checked against the graph inputs (the model's and the extension's) first.
        Memory stays bounded by one batch of outputs (``reuse_outputs`` batches when reusing). On
        CUDA, inputs and outputs are bound on the device with IOBinding and only the outputs are
        copied back. A graph that fixes its batch size runs at that size: a short batch is filled
        with copies of its last item and the filler's rows are dropped from the (batch-first)
        outputs; one whose inputs declare a symbolic batch but that onnxruntime refuses to run
        several at once runs one input per call (:class:`~oversmooth.importers.runtime.batching.OnePerCall`).

        Parameters
        ----------
        feeds : Inputs or mapping of str to ndarray
            Batch-first arrays keyed by graph input name.
        batch_size : int, optional
            Items per onnxruntime call (default: all at once; at most a batch size the graph fixes).
        progress : bool
            Show a tqdm progress bar on stderr.
        reuse_outputs : int
            k > 0: write each batch's outputs into the arrays yielded k batches before (same
            input shapes; True counts as 1): no allocation per batch, but a yielded array is valid
            only until k more batches are requested. For consumers that reduce each batch soon
            (the audit, which keeps k = 2 while it reduces one batch beside the next one's run).
            0: fresh arrays.
        first_item : int
            Number of the first item, for error messages (when ``feeds`` is one part of more).
        """
        arrays = self._feeds(feeds)
        fixed = fixed_batch(self.inputs)
        n_items = batch_count(arrays)
        size = call_size(batch_size, n_items, fixed)
        parts: Any = calls(arrays, size, fixed)
        if progress:
            from tqdm import tqdm

            parts = tqdm(parts, desc="onnxruntime", unit="batch", total=-(-n_items // size))
        for start, stop, batch in parts:
            if fixed is None:  # a call onnxruntime refuses is retried one input per call
                yield self.one_per_call.run(self._call, batch, reuse_outputs, first_item + start)
            else:
                outputs = self._call(batch, reuse_outputs, first_item + start, stop - start)
                yield drop_filler(outputs, stop - start, fixed)

    def _call(self, batch: dict[str, np.ndarray], reuse: int, first: int, items: int) -> dict:
        """One onnxruntime call of ``items`` items numbered from ``first`` (a one-line error)."""
        try:
            return self._run_batch(batch, reuse)
        except Exception as err:  # onnxruntime's run-time errors derive from Exception only
            fed = ", ".join(  # the model's own inputs, not the extension's
                f"{name} {list(np.shape(array))}"
                for name, array in batch.items()
                if name in self._model_inputs
            )
            raise RunnerError(
                f"onnxruntime failed on items {first}-{first + items - 1} (fed {fed}): {err}"
            ) from err

    def collect(
        self, feeds: Inputs | Mapping[str, np.ndarray], *, batch_size: int | None = None
    ) -> dict[str, np.ndarray]:
        """Run every batch and concatenate each output along axis 0."""
        parts: dict[str, list[np.ndarray]] = {name: [] for name in self.output_names}
        for outputs in self.run(feeds, batch_size=batch_size):
            for name, array in outputs.items():
                parts[name].append(array)
        return {name: np.concatenate(arrays, axis=0) for name, arrays in parts.items()}


def plain_session(
    model: OnnxModel,
    *,
    provider: Provider = "auto",
    threads: int | None = None,
    optimization: Optimization = "all",
) -> Any:
    """Return an onnxruntime session of the unmodified model with :class:`Runner`'s options.

    The baseline for instrumentation overhead: the fully fused graph with its own outputs.
    """
    return Runner(
        model,
        expose=[],
        provider=provider,
        threads=threads,
        include_outputs=True,
        optimization=optimization,
    ).session
