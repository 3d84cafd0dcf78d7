"""The quickstart from README.md: an embedded LocalCluster, a map and a reduction."""

from shoal import Client, LocalCluster


def inc(x):
    return x + 1


if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        futs = client.map(inc, range(10_000))
        total = client.submit(sum, futs)
        print(total.result())  # 50005000
