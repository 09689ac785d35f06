"""A local Dask cluster for the tests: two worker processes, one thread each, no dashboard.

Started once per test module (a few seconds) by :func:`oversmooth.executor.local_cluster`, the
workers' files under the test's temporary folder. Tests reach it by its ``tcp://`` address, as a
user reaches an existing cluster.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from oversmooth.executor import local_cluster

#: Workers of the test cluster (the issue's "local cluster of two workers").
WORKERS = 2


@contextlib.contextmanager
def started_cluster(folder: Path) -> Iterator[str]:
    """Start the cluster, yield its scheduler address, shut it down."""
    with local_cluster(WORKERS, str(folder)) as (_client, address):
        yield address
