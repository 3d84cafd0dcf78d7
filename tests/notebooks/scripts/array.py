# Dask example notebook "array.ipynb" (dask/dask-examples, BSD-3-Clause): its code
# cells in order, as a script; run by ../run_notebook.py. Nothing substituted.
# %%
from dask.distributed import Client, progress
client = Client(processes=False, threads_per_worker=4, n_workers=1, memory_limit='2GB')
client
# %%
import dask.array as da
x = da.random.random((10000, 10000), chunks=(1000, 1000))
x
# %%
y = x + x.T
z = y[::2, 5000:].mean(axis=1)
z
# %%
z.compute()
# %%
y = y.persist()
# %%
%time y[0, 0].compute()
# %%
%time y.sum().compute()
