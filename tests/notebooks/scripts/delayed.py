# Dask example notebook "delayed.ipynb" (dask/dask-examples, BSD-3-Clause): its code
# cells in order, as a script; run by ../run_notebook.py (which may scale the functions'
# sleeps). The graph picture needs graphviz: skipped.
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

def dec(x):
    time.sleep(random.random())
    return x - 1

def add(x, y):
    time.sleep(random.random())
    return x + y
# %%
%%time
x = inc(1)
y = dec(2)
z = add(x, y)
z
# %%
import dask
inc = dask.delayed(inc)
dec = dask.delayed(dec)
add = dask.delayed(add)
# %%
x = inc(1)
y = dec(2)
z = add(x, y)
z
# %% skip: needs graphviz
z.visualize(rankdir='LR')
# %%
z.compute()
# %%
zs = []
# %%
%%time
for i in range(256):
    x = inc(i)
    y = dec(x)
    z = add(x, y)
    zs.append(z)
# %%
zs = dask.persist(*zs)
# %%
client.cluster.scale(10)
# %%
L = zs
while len(L) > 1:
    new_L = []
    for i in range(0, len(L), 2):
        lazy = add(L[i], L[i + 1])
        new_L.append(lazy)
    L = new_L

dask.compute(L)
