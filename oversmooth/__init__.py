"""oversmooth, the application: the ``oversmooth`` command and what only a command needs.

Above the three libraries, importing any of them and imported by none:

- :mod:`oversmooth.cli` — the dispatcher (one-line errors, exit codes);
- :mod:`oversmooth.commands` — every subcommand, one module each;
- :mod:`oversmooth.executor` — where parallel work runs (this process or a Dask cluster);
- :mod:`oversmooth.sharding` — the audit's inputs in shards on an executor;
- :mod:`oversmooth.report` — the audit's report folder.

The libraries: :mod:`simulator` (NumPy/SciPy theory), :mod:`importers` (ONNX models: matching,
weights, running, records), :mod:`figures` (matplotlib: plots and the paper's scripts).
"""
