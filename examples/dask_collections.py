"""Dask collections on shoal: the Client becomes Dask's default scheduler."""

import dask.array as da

from shoal import Client

if __name__ == "__main__":
    with Client() as client:  # a LocalCluster of its own
        x = da.random.random((4_000, 4_000), chunks=(500, 500))
        print((x + x.T).mean().compute())  # runs on shoal
        y = client.persist(x)  # returns at once; futures behind the chunks
        total = client.compute(y.sum())  # a Future
        print(total.result())
