# Dask example notebook "xarray.ipynb" (dask/dask-examples, BSD-3-Clause): its code cells
# in order, as a script; run by ../run_notebook.py. One substitution: the notebook
# downloads xarray's tutorial dataset "air_temperature"; here a local file with the same
# coordinates, shape and dtype (values from a seeded generator) is written first and
# opened with xr.open_dataset and the same chunks. The plots need matplotlib.
# %%
%matplotlib inline

from dask.distributed import Client
import xarray as xr
# %%
client = Client(n_workers=2, threads_per_worker=2, memory_limit='1GB')
client
# %% local stand-in for xr.tutorial.open_dataset('air_temperature', ...): no network
import numpy as np
import pandas as pd
_time = pd.date_range("2013-01-01", "2014-12-31 18:00", freq="6h")
_lat = np.arange(75.0, 14.9, -2.5, dtype="float32")
_lon = np.arange(200.0, 330.1, 2.5, dtype="float32")
_season = 15 * np.cos(2 * np.pi * (_time.dayofyear.values / 365.25))[:, None, None]
_air = 270 + _season + 10 * np.random.default_rng(0).standard_normal(
    (len(_time), len(_lat), len(_lon)))
xr.Dataset(
    {"air": (("time", "lat", "lon"), _air.astype("float32"))},
    coords={"time": _time, "lat": _lat, "lon": _lon},
    attrs={"title": "local stand-in for 4x daily NMC reanalysis (1948)"},
).to_netcdf("air_temperature.nc")
# %%
ds = xr.open_dataset('air_temperature.nc',
                     chunks={'lat': 25, 'lon': 25, 'time': -1})
ds
# %%
da = ds['air']
da
# %%
da.data
# %%
da2 = da.groupby('time.month').mean('time')
da3 = da - da2
da3
# %%
computed_da = da3.compute()
type(computed_da.data)
# %%
computed_da
# %%
da = da.persist()
# %%
resampled_da = da.resample(time='1w').mean('time')
resampled_da.std('time')
# %%
import matplotlib
matplotlib.use("Agg")  # no display on the test machine (Jupyter's inline backend there)
resampled_da.std('time').plot(figsize=(12, 8))
# %%
da_smooth = da.rolling(time=30).mean()
da_smooth
# %%
da.sel(time='2013-01-01T18:00:00')
# %%
da.sel(time='2013-01-01T18:00:00').load()
# %%
import numpy as np
import xarray as xr
import bottleneck

def covariance_gufunc(x, y):
    return ((x - x.mean(axis=-1, keepdims=True))
            * (y - y.mean(axis=-1, keepdims=True))).mean(axis=-1)

def pearson_correlation_gufunc(x, y):
    return covariance_gufunc(x, y) / (x.std(axis=-1) * y.std(axis=-1))

def spearman_correlation_gufunc(x, y):
    x_ranks = bottleneck.rankdata(x, axis=-1)
    y_ranks = bottleneck.rankdata(y, axis=-1)
    return pearson_correlation_gufunc(x_ranks, y_ranks)

def spearman_correlation(x, y, dim):
    return xr.apply_ufunc(
        spearman_correlation_gufunc, x, y,
        input_core_dims=[[dim], [dim]],
        dask='parallelized',
        output_dtypes=[float])
# %%
corr = spearman_correlation(da.chunk({'time': -1}),
                            da_smooth.chunk({'time': -1}),
                            'time')
corr
# %%
corr.plot(figsize=(12, 8))
