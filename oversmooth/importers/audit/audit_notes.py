"""The notes an audit states before it measures: about the model as read, and about its inputs.

Each is one :class:`~oversmooth.importers.audit.records.Note` (kind, one line), in the order the report shows
them: blocks left unmatched, attention skipped by design, departures from the linear update,
key/value caches fed empty, quantised activations read through, Softmaxes that are not
attention; then what a decoder's encoder
states were fed, random inputs, metrics not computed.

Public API
----------
model_notes
    The notes about the model as matched and read.
input_notes
    The notes about what the audit feeds it.
"""

from __future__ import annotations

from oversmooth.importers.audit.records import Note
from oversmooth.importers.graph import OnnxModel
from oversmooth.importers.inputs.decoder_feeds import cache_note, encoder_states_note
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.match import MatchReport, departures_note
from oversmooth.importers.match.coverage import missing_blocks_note, skipped_blocks_note
from oversmooth.simulator.statistics import SPECTRAL_METRICS

__all__ = ["input_notes", "model_notes"]

#: The note every audit of random inputs carries.
RANDOM_INPUTS = "inputs are RANDOM, not real data: smoothing of noise says little about the model"


def model_notes(report: MatchReport, graph: OnnxModel) -> list[Note]:
    """What the matched model lacks or departs from, and how it was read."""
    notes = [Note("partial", missing_blocks_note(report))] if report.unmatched else []
    notes += [Note("skipped", skipped_blocks_note(report))] if report.skipped else []
    departed = departures_note(report.blocks)
    notes += [Note("departure", departed)] if departed else []
    caches = [spec.name for spec in graph.inputs if spec.past_axis is not None]
    notes += [Note("kv-cache", cache_note(caches))] if caches else []
    notes += [Note("kv-cache", item.note()) for item in graph.branches]
    notes += [Note("quantized", graph.read_through.note())] if graph.read_through else []
    notes += [Note("not-attention", _not_attention_note(report))] if report.not_attention else []
    return notes


def _not_attention_note(report: MatchReport) -> str:
    """One line naming the Softmaxes that are not token attention (neither blocks nor declined)."""
    found = report.not_attention
    named = "; ".join(f"{failure.softmax!r}: {failure.not_attention}" for failure in found[:3])
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return (
        f"{len(found)} Softmax node(s) are not token attention and are neither audited nor "
        f"counted as declined ({named}{more})"
    )


def input_notes(graph: OnnxModel, inputs: Inputs, *, spectral: bool) -> list[Note]:
    """What the inputs are (a decoder's encoder states, noise) and what is not computed."""
    states = encoder_states_note(graph.inputs, inputs.source)
    notes = [Note("encoder-states", states)] if states else []
    notes += [Note("random", RANDOM_INPUTS)] if inputs.random else []
    if not spectral:
        text = f"not computed (spectral=False): {', '.join(SPECTRAL_METRICS)}"
        notes.append(Note("not-computed", text))
    return notes
