"""A sweep on a real Dask LocalCluster (worker processes) in which one worker is killed after the first chunk."""
import os
import signal
from unittest import mock

from comet_dse.design_space import engine


def sweep_killing_a_worker(distributed, study, output) -> tuple:
    """(ranking, killed chunk indices) of ``study`` run to ``output`` on 2 Dask worker processes,
    the first worker killed with SIGKILL as soon as a chunk reports."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=50) as cluster, distributed.Client(cluster) as client:
        pids = list(client.run(os.getpid).values())
        killed = []

        def kill_one(index):
            if not killed:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(index)

        # The scheduler runs: reaching it gets a hang bound (120 s) instead of engine's 5 s, which a loaded
        # machine can overrun (no test asserts a speed: docs/reliability.md).
        with mock.patch.object(engine, "SCHEDULER_TIMEOUT_S", 120):
            ranking = engine.run_study(study, output, progress=False, engine="dask",
                                       scheduler=cluster.scheduler_address, on_chunk=kill_one)
    return ranking, killed
