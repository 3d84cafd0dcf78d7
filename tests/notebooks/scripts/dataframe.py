# Dask example notebook "dataframe.ipynb" (dask/dask-examples, BSD-3-Clause): its code
# cells in order, as a script; run by ../run_notebook.py. Nothing substituted (the plot
# needs matplotlib, the groupby-apply scikit-learn). The last cell fails with today's dask
# whatever the scheduler (meta=object cannot be tokenized): expected, as on Dask.
# %%
from dask.distributed import Client, progress
client = Client(n_workers=2, threads_per_worker=2, memory_limit='1GB')
client
# %%
import dask
import dask.dataframe as dd
df = dask.datasets.timeseries()
# %%
df
# %%
df.dtypes
# %%
import pandas as pd
pd.options.display.precision = 2
pd.options.display.max_rows = 10
# %%
df.head(3)
# %%
df2 = df[df.y > 0]
df3 = df2.groupby('name').x.std()
df3
# %%
computed_df = df3.compute()
type(computed_df)
# %%
computed_df
# %%
df = df.persist()
# %%
%matplotlib inline
# %%
df[['x', 'y']].resample('1h').mean().head()
# %%
import matplotlib
matplotlib.use("Agg")  # no display on the test machine (Jupyter's inline backend there)
df[['x', 'y']].resample('24h').mean().compute().plot()
# %%
df[['x', 'y']].rolling(window='24h').mean().head()
# %%
df.loc['2000-01-05']
# %%
%time df.loc['2000-01-05'].compute()
# %%
df = df.set_index('name')
df
# %%
df = df.persist()
# %%
%time df.loc['Alice'].compute()
# %%
from sklearn.linear_model import LinearRegression

def train(partition):
    est = LinearRegression()
    est.fit(partition[['x']].values, partition.y.values)
    return est
# %% expect-error: TokenizationError  (dask 2026.8 cannot tokenize meta=object: fails on Dask distributed too)
df.groupby('name').apply(train, meta=object).compute()
