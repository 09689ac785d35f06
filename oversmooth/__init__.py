"""oversmooth, the application: the ``oversmooth`` command and what only a command needs.

Above the four libraries, importing any of them and imported by none:

- :mod:`oversmooth.cli` — the dispatcher (one-line errors, exit codes);
- :mod:`oversmooth.commands` — every subcommand, one module each;
- :mod:`oversmooth.executor` — where parallel work runs (this process or a Dask cluster);
- :mod:`oversmooth.sharding` — the audit's inputs in shards on an executor;
- :mod:`oversmooth.report` — the audit's report folder.

The libraries: :mod:`oversmooth.simulator` (NumPy/SciPy theory), :mod:`oversmooth.importers` (ONNX
models: matching, weights, running, records), :mod:`oversmooth.figures` (matplotlib: plots and the
paper's scripts), :mod:`oversmooth.training` (torch, the ``train`` extra: small ViTs trained with
the ⁺/⁻ parametrisation). This file imports nothing, so importing a library loads no part of the
application.
"""
