# Dask example notebook "resilience.ipynb" (dask/dask-examples, BSD-3-Clause): its code
# cells in order, as a script; run by ../run_notebook.py. Nothing substituted: worker
# processes are really killed with SIGTERM while the bag computes.
# %%
import dask

dask.config.set({'distributed.scheduler.allowed-failures': 100});
# %%
from dask.distributed import Client, LocalCluster
from dask import bag as db
import os
import random
from time import sleep
# %%
cluster = LocalCluster(threads_per_worker=1, n_workers=4, memory_limit=400e6)
client = Client(cluster)
client
# %%
def multiply_by_two(x):
    sleep(0.02)
    return 2 * x
# %%
N = 400

x = db.from_sequence(range(N), npartitions=N // 2)

mults = x.map(multiply_by_two)

summed = mults.sum()
# %%
all_current_workers = [w.pid for w in cluster.scheduler.workers.values()]
non_preemptible_workers = all_current_workers[:2]
# %%
def kill_a_worker():
    preemptible_workers = [
        w.pid for w in cluster.scheduler.workers.values()
        if w.pid not in non_preemptible_workers]
    if preemptible_workers:
        os.kill(random.choice(preemptible_workers), 15)
# %%
summed = client.compute(summed)

while not summed.done():
    kill_a_worker()
    sleep(3.0)
# %%
print(f"`sum(range({N}))` on cluster: {summed.result()}\t(should be {N * (N-1)})")
