"""The dask.distributed clusters the tests start: on 127.0.0.1 only, without a dashboard."""

import distributed

# Seconds a cluster may take to start, and a whole distributed test to finish.
CLUSTER_TIMEOUT = 120


def local_cluster(memory_limit, n_workers=2):
  """A LocalCluster of `n_workers` worker processes of 1 thread each, on 127.0.0.1."""
  return distributed.LocalCluster(
    n_workers=n_workers,
    threads_per_worker=1,
    processes=True,
    memory_limit=memory_limit,
    host="127.0.0.1",
    dashboard_address=None,
  )
