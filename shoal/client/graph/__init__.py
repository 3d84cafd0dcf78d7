"""Dask graphs as shoal tasks: every decision about how a Dask collection becomes what
the scheduler receives is made in this package, on the client.

The path of one ``compute``/``persist``/``get``, in order:

- :mod:`~shoal.client.graph.collections`: Dask's entry points (``compute``,
  ``persist``, ``get``, being Dask's default scheduler) and ``submit_graph``, which runs
  the steps below and hands the encoded parts to the client's connection.
- :mod:`~shoal.client.graph.blockwise_expand`: materialising the graph, with Dask
  array Blockwise layers expanded without Dask's per-task path (and
  :mod:`~shoal.client.graph.linear_fuse`, Dask's linear fusion on positions);
  :mod:`~shoal.client.graph.reduction_expand`, Dask's legacy reduction tasks converted
  to its task spec without recursion; :mod:`~shoal.client.graph.tree_fuse`, a large
  reduction's tiny root leaves fused into their reduction tasks (the one step that
  makes a graph other than Dask's).
- :mod:`~shoal.client.graph.dask_graph`: culling and checking the graph, and the
  ``GraphEncoder`` that turns a node into a ``TaskSpec`` (functions into the function
  table, arguments plain or pickled).
- :mod:`~shoal.client.graph.templates` and :mod:`~shoal.client.graph.layer_encode`:
  a layer's tasks encoded once, as a template plus per-task slots.
- :mod:`~shoal.client.graph.order`: the order the tasks are submitted in
  (``dask.order`` up to a bound, a cheap depth-first order above it).
- :mod:`~shoal.client.graph.data`: large constants of a graph sent to the workers
  once, not inside every compute.
- :mod:`~shoal.client.graph.gc_pause`: the cyclic collector paused while a graph is
  built and submitted.
"""
