# Dask example notebook "dataframes/01-data-access.ipynb" (dask/dask-examples,
# BSD-3-Clause): its code cells in order, as a script; run by ../run_notebook.py. The
# embedded video and the two "read_csv?" help cells are IPython display/help: skipped.
# %% skip: embeds a YouTube video with IPython.display
from IPython.display import HTML
# %%
from dask.distributed import Client
client = Client(n_workers=1, threads_per_worker=4, processes=False, memory_limit='2GB')
client
# %%
import dask
df = dask.datasets.timeseries()
df
# %%
import os
import datetime

if not os.path.exists('data'):
    os.mkdir('data')

def name(i):
    """ Provide date for filename given index """
    return str(datetime.date(2000, 1, 1) + i * datetime.timedelta(days=1))

df.to_csv('data/*.csv', name_function=name);
# %%
!ls data/*.csv | head
# %%
!head data/2000-01-01.csv
# %%
!head data/2000-01-30.csv
# %%
import pandas as pd

df = pd.read_csv('data/2000-01-01.csv')
df.head()
# %%
import dask.dataframe as dd

df = dd.read_csv('data/2000-*-*.csv')
df
# %%
df.head()
# %% skip: IPython help
pd.read_csv?
# %% skip: IPython help
dd.read_csv?
# %%
df = dd.read_csv('data/2000-*-*.csv', parse_dates=['timestamp'])
df
# %%
%time df.groupby('name').x.mean().compute()
# %%
df.to_parquet('data/2000-01.parquet', engine='pyarrow')
# %%
!ls data/2000-01.parquet/
# %%
df = dd.read_parquet('data/2000-01.parquet', engine='pyarrow')
df
# %%
%time df.groupby('name').x.mean().compute()
# %%
%%time
df = dd.read_parquet('data/2000-01.parquet', columns=['name', 'x'], engine='pyarrow')
df.groupby('name').x.mean().compute()
