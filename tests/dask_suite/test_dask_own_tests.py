"""A curated set of Dask's own test functions (from the installed dask package), every
compute routed through one module-scoped shoal cluster: the ``scheduler`` config and
every named local scheduler ("sync", "threads", ... which Dask's ``assert_eq`` asks
for) are the shoal Client's ``get``.

``SHOAL_DASK_SUITE=distributed`` runs the same selection through Dask distributed's
Client instead: the reference for "passes where Dask distributed passes".

The selection is ``SELECTED``; deliberate exclusions, with reasons, are in
``EXCLUDED``; at most two parametrizations of each function run (conftest.py).
"""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Iterator
from typing import Any

import dask
import dask.base
import pytest

# Module -> the test functions chosen from it ("*": all of them). A selection, not the
# whole modules: Dask's full modules hold thousands of parametrized cases, and
# dask-expr's client-side planning makes some single tests take ~45 s on two shared
# cores (test_groupby.py::test_split_apply_combine_on_series, whatever the scheduler).
SELECTED: dict[str, list[str] | str] = {
    "dask.array.tests.test_reductions": [
        "test_reductions_0D",
        "test_reductions_1D",
        "test_reductions_2D_nans",
        "test_arg_reductions",
        "test_nanarg_reductions",
        "test_moment",
        "test_nan",
        "test_reduction_errors",
        "test_tree_reduce_depth",
        "test_tree_reduce_set_options",
        "test_general_reduction_names",
        "test_weighted_reduction",
        "test_trace",
        "test_numel",
        "test_median",
        "test_nanquantile",
        "test_topk_argtopk1",
        "test_nan_reduction_warnings",
        "test_mean_func_does_not_warn",
        "test_nan_func_does_not_warn",
    ],
    "dask.array.tests.test_slicing": [
        "test_slice_1d",
        "test_slicing_with_Nones",
        "test_take",
        "test_take_sorted",
        "test_slicing_and_chunks",
        "test_slicing_exhaustively",
        "test_index_with_int_dask_array",
        "test_index_with_bool_dask_array",
        "test_boolean_list_slicing",
        "test_vindex_with_dask_array",
        "test_slicing_with_numpy_arrays",
        "test_slice_optimizations",
        "test_uneven_chunks",
        "test_oob_check",
        "test_empty_slice",
        "test_multiple_list_slicing",
        "test_permit_oob_slices",
        "test_slicing_consistent_names",
    ],
    "dask.dataframe.tests.test_groupby": [
        "test_full_groupby",
        "test_groupby_multilevel_agg",
        "test_series_groupby",
        "test_groupby_get_group",
        "test_groupby_index_array",
        "test_groupby_set_index",
        "test_groupby_unique",
        "test_groupby_value_counts",
        "test_dataframe_groupby_nunique",
        "test_groupby_cov",
        "test_cumulative",
        "test_groupby_transform_funcs",
        "test_groupby_apply_tasks",
        "test_groupby_reduction_split",
        "test_groupby_dropna_pandas",
        "test_groupby_shift_series",
        "test_aggregate_median",
        "test_df_groupby_idxmax",
        "test_groupby_sort_argument",
        "test_hash_groupby_aggregate",
        "test_groupby_not_supported",
        "test_groupby_string_label",
    ],
    "dask.dataframe.tests.test_multi": [
        "test_merge",
        "test_merge_by_multiple_columns",
        "test_concat",
        "test_concat_series",
        "test_concat_categorical",
        "test_melt",
        "test_merge_asof_on",
        "test_merge_asof_indexed",
        "test_cheap_single_partition_merge",
        "test_merge_tasks_passes_through",
        "test_merge_maintains_columns",
        "test_sequential_joins",
        "test_categorical_join",
        "test_merge_outer_empty",
        "test_nullable_types_merge",
        "test_half_indexed_dataframe_avoids_shuffle",
    ],
    "dask.dataframe.tests.test_shuffle": [
        "test_shuffle",
        "test_set_index",
        "test_set_index_2",
        "test_set_index_3",
        "test_shuffle_npartitions",
        "test_shuffle_empty_partitions",
        "test_set_index_general",
        "test_sort_values",
        "test_sort_values_single_partition",
        "test_set_index_sorts",
        "test_set_index_drop",
        "test_shuffle_by_as_list",
        "test_default_partitions",
        "test_set_index_with_explicit_divisions",
        "test_compute_divisions",
        "test_set_index_on_empty",
        "test_dataframe_shuffle_on_arg",
    ],
    "dask.bag.tests.test_bag": [
        "test_map_method",
        "test_filter",
        "test_remove",
        "test_fold",
        "test_distinct",
        "test_frequencies",
        "test_topk",
        "test_lambdas",
        "test_reductions",
        "test_tree_reductions",
        "test_aggregation",
        "test_std",
        "test_var",
        "test_join",
        "test_foldby",
        "test_map_partitions",
        "test_groupby",
        "test_groupby_tasks",
        "test_groupby_with_indexer",
        "test_flatten",
        "test_concat",
        "test_zip",
        "test_product",
        "test_to_dataframe",
        "test_repartition_npartitions",
        "test_take",
        "test_accumulate",
        "test_pluck",
        "test_starmap",
        "test_from_delayed",
        "test_to_textfiles",
        "test_read_text",
    ],
    "dask.tests.test_delayed": "*",
}

# Left out on purpose, with why (besides Dask's network/gpu/slow marks, conftest.py).
EXCLUDED: dict[str, str] = {
    "test_delayed::test_delayed_visualise_warn": "needs graphviz, renders no compute",
    # both assert that compute() returns the very object given (``is``): results
    # computed in worker processes come back as copies (Dask distributed fails them too)
    "test_delayed::test_callable_obj": "asserts object identity across processes",
    "test_delayed::test_traverse_false": "asserts object identity across processes",
    "test_delayed::test_p2p_as_delayed": "starts its own Dask distributed cluster (gen_cluster)",
}

BACKEND = os.environ.get("SHOAL_DASK_SUITE", "shoal")


def _import_tests() -> list[str]:
    names = []
    for module_name, chosen in SELECTED.items():
        module = importlib.import_module(module_name)
        short = module_name.rsplit(".", 1)[1]
        for name, value in vars(module).items():  # its own fixtures (agg_func, ...)
            is_fixture = type(value).__name__ == "FixtureFunctionDefinition" or hasattr(
                value, "_pytestfixturefunction"
            )
            # not test_groupby's autouse auto_shuffle_method: it would run every test
            # here under each shuffle method (groupby runs under shoal's default, p2p)
            if is_fixture and name != "auto_shuffle_method":
                globals()[name] = value
        if chosen == "*":
            chosen = [n for n, v in vars(module).items() if n.startswith("test_") and callable(v)]
        for name in chosen:
            if f"{short}::{name}" in EXCLUDED:
                continue
            alias = f"test_{short[5:]}__{name[5:]}"
            globals()[alias] = getattr(module, name)  # AttributeError: dask renamed it
            names.append(alias)
    return names


IMPORTED = _import_tests()
COMPUTES = {"count": 0}


@pytest.fixture(scope="module")
def cluster_get() -> Iterator[Any]:
    if BACKEND == "distributed":
        from distributed import Client, LocalCluster
    else:
        from shoal import Client, LocalCluster

    def counting_get(client: Any, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        COMPUTES["count"] += 1
        kwargs.pop("num_workers", None)  # local schedulers' options
        kwargs.pop("pool", None)
        return type(client).get(client, dsk, keys, **kwargs)

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster,
        Client(cluster) as client,
    ):
        # bound to the client, as client.get is: shoal (like Dask) recognises its
        # client as the scheduler by the method's __self__ (shuffle method choice)
        yield types.MethodType(counting_get, client)


@pytest.fixture(autouse=True)
def _through_the_cluster(cluster_get: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(dask.base.named_schedulers):
        monkeypatch.setitem(dask.base.named_schedulers, name, cluster_get)
    with dask.config.set(scheduler=cluster_get):
        yield


def test_every_compute_runs_on_the_cluster(cluster_get: Any) -> None:
    import dask.array as da

    def where(_: Any) -> int:
        return os.getpid()

    before = COMPUTES["count"]
    pids = {
        dask.delayed(where)(1).compute(),  # the config's scheduler
        dask.delayed(where)(2).compute(scheduler="sync"),  # what assert_eq asks for
        dask.delayed(where)(3).compute(scheduler="threads"),
    }
    assert COMPUTES["count"] == before + 3
    assert os.getpid() not in pids  # in worker processes, not here
    assert da.ones(10, chunks=3).sum().compute(scheduler="single-threaded") == 10
    assert COMPUTES["count"] == before + 4
