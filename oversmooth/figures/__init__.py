"""Figures and tables of "Setting the Record Straight on Transformer Oversmoothing", regenerated.

``python -m oversmooth.figures [--quick] [--only NAME ...] --out DIR`` runs every script in :data:`SCRIPTS`;
each writes ``NAME.png``, a tidy ``NAME.csv`` and ``NAME.json`` (provenance) into DIR. The scripts in
:data:`ON_DEMAND` run only when named with ``--only``.
"""

#: Every figure/table script, in the order they run (module names inside this package).
SCRIPTS = (
    "fig2_smoothing",
    "fig3_reparam",
    "fig4_layernorm",
    "fig5_spectra",
    "table1_dominance",
    "theory_regime_map",
    "theory_rates",
    "theory_mitigations",
)
#: Scripts that run only when named (``--only NAME``): they read results that take minutes to make
#: (``table23_training`` reads the folder of ``oversmooth train``, ``trained_audit`` audits the models
#: that ``oversmooth train --export-onnx`` wrote there: ``--results``, default ``train-out``).
ON_DEMAND = ("table23_training", "trained_audit")
