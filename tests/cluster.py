"""A local Dask cluster for the tests: two worker processes, one thread each, no dashboard.

Started once per test module (a few seconds); the workers keep their files under the test's
temporary folder. Tests reach it by its ``tcp://`` address, as a user reaches an existing cluster.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

#: Workers of the test cluster (the issue's "local cluster of two workers").
WORKERS = 2


@contextlib.contextmanager
def local_cluster(folder: Path) -> Iterator[str]:
    """Start the cluster, yield its scheduler address, shut it down."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=WORKERS,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        # its HTTP server (metrics, health) on a free port: 8787 may be taken
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        worker_dashboard_address=None,
        silence_logs=logging.CRITICAL,
        local_directory=str(folder),
    ) as cluster:
        yield cluster.scheduler_address
