"""What an audit runs a model on: feeds for its graph inputs, and where they come from.

Modules
-------
feeds
    :class:`Inputs` (feeds plus provenance, in memory or read batch by batch) and checking feeds
    against a model's graph inputs.
sources
    Where inputs come from: bundled photographs and sentences, ``.npz``, images, text, noise.
decoder_feeds
    Feeds of a decoder exported for generation: key/value caches fed empty, position ids, encoder
    states.
npz
    ``.npz`` feeds (one file or a folder of shards), read batch by batch.
"""

from __future__ import annotations

from oversmooth.importers.inputs.feeds import Inputs, check_feeds, for_graph
from oversmooth.importers.inputs.sources import (
    bundled_inputs,
    default_inputs,
    from_images,
    from_npz,
    from_text,
    random_inputs,
)

__all__ = [
    "Inputs",
    "bundled_inputs",
    "check_feeds",
    "default_inputs",
    "for_graph",
    "from_images",
    "from_npz",
    "from_text",
    "random_inputs",
]
