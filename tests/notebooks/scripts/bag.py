# Dask example notebook "bag.ipynb" (dask/dask-examples, BSD-3-Clause): its code cells
# in order, as a script; run by ../run_notebook.py. Nothing substituted (make_people
# needs mimesis; the data is written to ./data of the run's directory).
# %%
from dask.distributed import Client, progress
client = Client(n_workers=4, threads_per_worker=1)
client
# %%
import dask
import json
import os

os.makedirs('data', exist_ok=True)
b = dask.datasets.make_people()
b.map(json.dumps).to_textfiles('data/*.json')
# %%
!head -n 2 data/0.json
# %%
import dask.bag as db
import json

b = db.read_text('data/*.json').map(json.loads)
b
# %%
b.take(2)
# %%
b.filter(lambda record: record['age'] > 30).take(2)
# %%
b.map(lambda record: record['occupation']).take(2)
# %%
b.count().compute()
# %%
result = (b.filter(lambda record: record['age'] > 30)
           .map(lambda record: record['occupation'])
           .frequencies(sort=True)
           .topk(10, key=1))
result
# %%
result.compute()
# %%
(b.filter(lambda record: record['age'] > 30)
  .map(json.dumps)
  .to_textfiles('data/processed.*.json'))
# %%
b.take(1)
# %%
def flatten(record):
    return {
        'age': record['age'],
        'occupation': record['occupation'],
        'telephone': record['telephone'],
        'credit-card-number': record['credit-card']['number'],
        'credit-card-expiration': record['credit-card']['expiration-date'],
        'name': ' '.join(record['name']),
        'street-address': record['address']['address'],
        'city': record['address']['city'],
    }

b.map(flatten).take(1)
# %%
df = b.map(flatten).to_dataframe()
df.head()
# %%
df[df.age > 30].occupation.value_counts().nlargest(10).compute()
