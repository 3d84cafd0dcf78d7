# Dask example notebook "futures.ipynb" (dask/dask-examples, BSD-3-Clause): its code
# cells in order, as a script; run by ../run_notebook.py (which may scale the functions'
# sleeps). Nothing substituted.
# %%
from dask.distributed import Client, progress
client = Client(threads_per_worker=4, n_workers=1)
client
# %%
import time
import random

def inc(x):
    time.sleep(random.random())
    return x + 1

def double(x):
    time.sleep(random.random())
    return 2 * x

def add(x, y):
    time.sleep(random.random())
    return x + y
# %%
inc(1)
# %%
future = client.submit(inc, 1)
future
# %%
future
# %%
future.result()
# %%
x = client.submit(inc, 1)
y = client.submit(double, 2)
z = client.submit(add, x, y)
z
# %%
z.result()
# %%
zs = []
# %%
%%time
for i in range(256):
    x = client.submit(inc, i)
    y = client.submit(double, x)
    z = client.submit(add, x, y)
    zs.append(z)
# %%
total = client.submit(sum, zs)
# %%
client.cluster.scale(10)
# %%
L = zs
while len(L) > 1:
    new_L = []
    for i in range(0, len(L), 2):
        future = client.submit(add, L[i], L[i + 1])
        new_L.append(future)
    L = new_L
# %%
del future, L, new_L, total
# %%
from dask.distributed import as_completed

zs = client.map(inc, zs)
seq = as_completed(zs)

while seq.count() > 2:
    a = next(seq)
    b = next(seq)
    new = client.submit(add, a, b)
    seq.add(new)
