"""The client programs the multi-host tests run on host A:

    python scenarios.py NAME SCHEDULER_ADDRESS

Each connects (credentials from SHOAL_* variables), waits for the two workers, does
its work and prints one line ``RESULT {json}`` for the test to check. Lines
``STEP ...`` tell the test where it is; a line on stdin lets it go on.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from shoal import Client, Security


def report(**values: Any) -> None:
    print("RESULT " + json.dumps(values), flush=True)


def step(name: str) -> None:
    print(f"STEP {name}", flush=True)
    sys.stdin.readline()  # the test has done its part


def inc(x: int) -> int:
    return x + 1


def slow_inc(x: int) -> int:
    time.sleep(0.25)
    return x + 1


def hosts_of(client: Client) -> dict[str, str]:
    """Worker address -> name."""
    return {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}


def quickstart(client: Client) -> None:
    workers = hosts_of(client)
    futs = client.map(inc, range(10_000))
    total = client.submit(sum, futs)
    # each worker makes one half; the sum needs both: a transfer between hosts
    on = {name: a for a, name in workers.items()}
    left = client.submit(sum, list(range(100)), workers=[on["b"]], pure=False)
    right = client.submit(sum, list(range(100, 200)), workers=[on["c"]], pure=False)
    both = client.submit(lambda x, y: x + y, left, right)
    report(workers=workers, total=total.result(), both=both.result())


def dataframe(client: Client) -> None:
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(14)
    n = 40_000
    left = pd.DataFrame({"id": np.arange(n), "k": rng.integers(0, 500, n), "x": rng.random(n)})
    right = pd.DataFrame({"k": np.arange(0, 500, 2), "y": rng.random(250)})
    ddl = dd.from_pandas(left, npartitions=8)
    ddr = dd.from_pandas(right, npartitions=3)

    shuffled = ddl.shuffle("k", shuffle_method="p2p").compute()
    pd.testing.assert_frame_equal(
        shuffled.sort_values("id").reset_index(drop=True), left.reset_index(drop=True)
    )
    merged = ddl.merge(ddr, on="k", shuffle_method="p2p").compute()
    want = left.merge(right, on="k")
    pd.testing.assert_frame_equal(
        merged.sort_values("id").reset_index(drop=True),
        want.sort_values("id").reset_index(drop=True),
    )
    p2p = [data for _, data in client.get_events("p2p")]
    report(rows=[len(shuffled), len(merged)], want=[len(left), len(want)], p2p_events=len(p2p))


def spill(client: Client) -> None:
    import numpy as np

    def block(i: int) -> Any:
        return np.full(1_000_000, i, dtype="float64")  # 8 MB

    on = {name: a for a, name in hosts_of(client).items()}
    # 160 MB on each worker: past its 100 MB target
    blocks = [
        *client.map(block, range(20), workers=[on["b"]], pure=False),
        *client.map(block, range(20, 40), workers=[on["c"]], pure=False),
    ]
    client.gather(client.map(len, blocks))
    step("persisted")  # the test looks for spill files on the workers' hosts
    sums = client.gather(client.map(lambda b: float(b.sum()), blocks))
    report(sums=sums)


def killed(client: Client) -> None:
    xs = client.map(slow_inc, range(40), pure=False)
    total = client.submit(sum, xs)
    while sum(f.done() for f in xs) < 8:  # some done on each host
        time.sleep(0.05)
    step("running")  # the test SIGKILLs the worker on host B
    report(total=total.result(), workers=hosts_of(client))


def retire(client: Client) -> None:
    on = {name: a for a, name in hosts_of(client).items()}
    held = client.map(inc, range(20), workers=[on["b"]], pure=False)
    client.gather(held)
    outcome = client.retire_workers([on["b"]])
    report(outcome=outcome, values=client.gather(held), workers=hosts_of(client), b=on["b"])


def big_array(seed: int) -> Any:
    import numpy as np

    return np.arange(1_000_000, dtype=np.float64) + seed  # 8 MB: worth lending on one host


def array_sum(x: Any, y: Any) -> float:
    return float(x.sum() + y.sum())


def leases_made(dask_worker: Any) -> int:
    return dask_worker.leases.made


def large(client: Client) -> None:
    """Large buffers between hosts: never lent (the hosts are apart), always right."""
    on = {name: a for a, name in hosts_of(client).items()}
    x = client.submit(big_array, 1, workers=[on["b"]], pure=False)
    y = client.submit(big_array, 2, workers=[on["c"]], pure=False)
    both = client.submit(array_sum, x, y, workers=[on["c"]], pure=False)  # B -> C
    report(
        total=both.result(),
        gathered=float(x.result().sum()),  # B -> the client on A
        leases=client.run(leases_made),
    )


def main() -> None:
    name, address = sys.argv[1], sys.argv[2]
    with Client(address, security=Security.from_env(), timeout=30) as client:
        client.wait_for_workers(2, timeout=30)
        globals()[name](client)


if __name__ == "__main__":
    main()
