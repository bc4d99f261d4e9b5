"""allocscope.torch's CUDA graph pools: the pools that CUDA graphs capture
into are declared to the interposer (allocscope_graph_pool), which then
records the blocks the PyTorch bridge sees in them as a graph's
(kFlagGraphPool): counted apart in reports, never judged by the detectors.

torch.cuda.graph_pool_handle() makes a pool id (0, n) that graphs share
(inductor's CUDA graph trees make theirs so); torch.cuda.MemPool makes ids
of the same form for a program's own tensors. So the pool ids come from
the calls that make or use them for graphs: graph_pool_handle()'s result,
and the pool passed to CUDAGraph.capture_begin (torch.cuda.graph(g,
pool=...) passes it there). A capture without a pool makes its own (n, 0),
which the interposer knows without a declaration."""

import functools

import torch

import allocscope as _allocscope

_installed = False


def _declare(pool):
    """Declares `pool`, a (first, second) pool id, as a graph's."""
    if pool is None:
        return
    api = _allocscope._get()
    if api is None:
        return
    try:
        first, second = (int(v) for v in pool)
    except (TypeError, ValueError):
        return
    api.graph_pool(first, second)


def install():
    """Wraps torch.cuda.graph_pool_handle and CUDAGraph.capture_begin (once)."""
    global _installed
    if _installed:
        return
    cuda = torch.cuda
    graphs = getattr(cuda, "graphs", None)
    handle = getattr(cuda, "graph_pool_handle", None)
    if callable(handle):

        @functools.wraps(handle)
        def graph_pool_handle(*args, **kwargs):
            pool = handle(*args, **kwargs)
            _declare(pool)
            return pool

        cuda.graph_pool_handle = graph_pool_handle
        if graphs is not None and getattr(graphs, "graph_pool_handle", None) is handle:
            graphs.graph_pool_handle = graph_pool_handle
    graph_class = getattr(graphs, "CUDAGraph", None)
    begin = getattr(graph_class, "capture_begin", None)
    if callable(begin):

        @functools.wraps(begin)
        def capture_begin(self, pool=None, *args, **kwargs):
            _declare(pool)
            return begin(self, pool, *args, **kwargs)

        graph_class.capture_begin = capture_begin
    _installed = True
