# Dask example notebook "applications/embarrassingly-parallel.ipynb" (dask/dask-examples,
# BSD-3-Clause): its code cells in order, as a script; run by ../run_notebook.py (which
# may scale the function's sleeps). The CSV goes to the run's directory, not /tmp.
# %%
from dask.distributed import Client, progress
client = Client(threads_per_worker=4, n_workers=1)
client
# %%
import time
import random

def costly_simulation(list_param):
    time.sleep(random.random())
    return sum(list_param)
# %%
%time costly_simulation([1, 2, 3, 4])
# %%
import pandas as pd
import numpy as np

input_params = pd.DataFrame(np.random.random(size=(500, 4)),
                            columns=['param_a', 'param_b', 'param_c', 'param_d'])
input_params.head()
# %%
results = []
# %%
%%time
for parameters in input_params.values[:10]:
    result = costly_simulation(parameters)
    results.append(result)
# %%
results
# %%
import dask
lazy_results = []
# %%
%%time

for parameters in input_params.values[:10]:
    lazy_result = dask.delayed(costly_simulation)(parameters)
    lazy_results.append(lazy_result)
# %%
lazy_results[0]
# %%
%time dask.compute(*lazy_results)
# %%
import dask
lazy_results = []

for parameters in input_params.values:
    lazy_result = dask.delayed(costly_simulation)(parameters)
    lazy_results.append(lazy_result)

futures = dask.persist(*lazy_results)
# %%
client.cluster.scale(10)
# %%
results = dask.compute(*futures)
results[:5]
# %%
futures = []
for parameters in input_params.values:
    future = client.submit(costly_simulation, parameters)
    futures.append(future)
# %%
results = client.gather(futures)
results[:5]
# %%
futures = client.map(costly_simulation, input_params.values)
# %%
results = client.gather(futures)
len(results)
# %%
print(results[0])
# %%
output = input_params.copy()
output['result'] = pd.Series(results, index=output.index)
output.sample(5)
# %%
%matplotlib inline
import matplotlib
matplotlib.use("Agg")  # no display on the test machine (Jupyter's inline backend there)
output['result'].plot()
# %%
output['result'].mean()
# %%
filtered_output = output[output['result'] > 2]
print(len(filtered_output))
filtered_output.to_csv('simulation_result.csv')
# %%
import dask.bag as db
b = db.from_sequence(list(input_params.values), npartitions=100)
b = b.map(costly_simulation)
# %%
%time results_bag = b.compute()
# %%
np.all(results) == np.all(results_bag)
