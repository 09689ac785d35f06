"""Every bound of the matcher's graph walks and probes, named once with the reason for its size.

A matcher reads graphs nobody here has seen, some hostile, so every walk is bounded: a walk that
reaches its bound gives up on the candidate (a reject with its reason), never loops or grows
without end. The bounds are far above what any exporter in the corpus needs
(docs/fixtures.md); raising one is safe but slows the rejection of graphs that are not attention.
Like :mod:`oversmooth.simulator.tolerances`, this is the one table: modules import their bounds from here.
"""

from __future__ import annotations

# --- walks back from the attention to the projections (projections, rotary) --------------------

#: Steps from a score or value MatMul back to its projection: the longest exporter chain seen
#: (split, reshape, transpose, rotary, clip, cast of fp16 exports) is under 20.
MAX_WALK = 64
#: Tensors ``GraphWalker.depends_on`` visits before it answers "depends": a whole 24-layer model
#: has about 3000 tensors, so a walk past this is not looking at one block.
MAX_ANCESTRY = 4000

# --- the score sum before the Softmax (scores, score_values) -------------------------------------

#: Nodes the walk back from a Softmax passes through the score sum (scale, masks, biases, soft-cap)
#: before it gives up.
MAX_SCORE_NODES = 64
#: Depth at which a score scale's operand is tested for reaching QK^T (a Mul/Div on the scores is
#: within a few ops of the product).
SCALE_SEARCH_DEPTH = 12
#: Depth through score sums and the gathers and layouts of a position term (DeBERTa's
#: disentangled terms are the deepest, about 15 ops).
POSITION_TERM_DEPTH = 24
#: Most nodes evaluated for one score term (a mask or position bias is a small computation).
MAX_TERM_NODES = 400
#: Most elements of any tensor of a score term's evaluation, where the probe's shapes tell (the
#: reference evaluator runs some ops, such as ScatterND, element by element in Python; a bias at
#: the probe's sizes is small: a fixed 577-token image model's 12-head table is 4.0M entries).
MAX_TERM_ELEMENTS = 1 << 22
#: Most layout ops followed back from a score term to its table or mask.
MAX_LAYOUT_STEPS = 16

# --- forward from the Softmax, and the residual stream (core, norms, stream, coverage) ----------

#: Steps from the Softmax forward to its MatMul with V (a Cast, Dropout or Where in between).
VALUE_MATMUL_STEPS = 8
#: Depth from a product forward to a Softmax for "is this Softmax attention?" (coverage).
SOFTMAX_SEARCH_DEPTH = 8
#: Tensors the walk forward from a rejected Softmax to its uses visits (coverage, softmax_uses)
#: before it takes the Softmax for attention: a guard, casts, views, a mask and a gate are a
#: dozen; past this the walk is following the model, not the probabilities.
SOFTMAX_USE_TENSORS = 64
#: Views (Cast, Reshape, ...) undone backwards from a tensor to the stream it is a view of.
VIEW_STEPS = 8
#: Depth of the forward search for views of a stream tensor.
VIEW_FORWARD_DEPTH = 4
#: Reshapes and casts skipped forward from a norm's output.
STRIP_RESHAPE_STEPS = 4
#: Depth of the forward search for the outermost norm reading a tensor (a decomposed LayerNorm is
#: about 9 ops deep).
NORM_SEARCH_DEPTH = 12
#: Nodes a residual branch may pass before it is called unknown.
MAX_BRANCH_NODES = 400
#: Sums passed from the attention output before its residual (attention + parallel MLP + stream).
MAX_SUM_CHAIN = 3

# --- the numeric layout probe (layout, the retry in importers.match) ----------------------------

#: Sizes assumed for symbolic batch and sequence dimensions while probing layouts (small and
#: distinct, so a layout that mixes batch and tokens shows).
PROBE_BATCH = 2
PROBE_SEQUENCE = 3
#: The size of every open axis in the second probe, after a head split failed at
#: PROBE_SEQUENCE: long enough for an audio front end's convolutions to leave frames (HuBERT and
#: wav2vec2 need 400 samples for one) and for an image whose size is left open to hold patches.
LONG_PROBE_SEQUENCE = 400
#: A static export's (batch x sequence) the probe will reproduce; a hostile Reshape declaring more
#: (say 2^20 x 2^20) is not probed at that size: its Softmax is rejected instead of allocating.
MAX_PROBE_TOKENS = 2**16
