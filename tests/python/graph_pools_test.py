"""CUDA graph pools declared to the interposer (allocscope/torch/_graphs.py),
on a stand-in for torch.cuda (no GPU, no torch needed): the pool that
torch.cuda.graph_pool_handle() returns and the pool passed to
CUDAGraph.capture_begin are declared (allocscope_graph_pool), with the
calls' results and arguments unchanged; a capture without a pool declares
nothing (its own pool is (n, 0), which the interposer knows)."""

import importlib
import os
import sys
import types

import pytest

sys.path.insert(0, os.environ.get("ALLOCSCOPE_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "../../tools/python")))
import allocscope  # noqa: E402


class FakeApi:
    def __init__(self):
        self.declared = []

    def graph_pool(self, first, second):
        self.declared.append((first, second))


@pytest.fixture
def graphs(monkeypatch):
    """(_graphs module, the stand-in torch.cuda, the fake C API)."""
    made = []

    def graph_pool_handle():
        made.append((0, len(made) + 1))
        return made[-1]

    class CUDAGraph:
        def __init__(self):
            self.begun = []

        def capture_begin(self, pool=None, capture_error_mode="global"):
            self.begun.append((pool, capture_error_mode))

    graphs_module = types.SimpleNamespace(graph_pool_handle=graph_pool_handle, CUDAGraph=CUDAGraph)
    cuda = types.SimpleNamespace(graph_pool_handle=graph_pool_handle, graphs=graphs_module)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    package = types.ModuleType("allocscope.torch")
    package.__path__ = [os.path.join(os.path.dirname(allocscope.__file__), "torch")]
    monkeypatch.setitem(sys.modules, "allocscope.torch", package)
    monkeypatch.delitem(sys.modules, "allocscope.torch._graphs", raising=False)
    module = importlib.import_module("allocscope.torch._graphs")
    api = FakeApi()
    monkeypatch.setattr(allocscope, "_get", lambda: api)
    module.install()
    return module, cuda, api


def test_a_pool_made_for_graphs_is_declared_and_returned_unchanged(graphs):
    module, cuda, api = graphs
    assert cuda.graph_pool_handle() == (0, 1)
    assert cuda.graphs.graph_pool_handle() == (0, 2)  # the module's name too
    assert api.declared == [(0, 1), (0, 2)]


def test_a_pool_passed_to_a_capture_is_declared_and_passed_on(graphs):
    module, cuda, api = graphs
    g = cuda.graphs.CUDAGraph()
    g.capture_begin((0, 7))
    g.capture_begin(pool=(0, 8), capture_error_mode="thread_local")
    g.capture_begin()  # its own pool: nothing to declare
    assert g.begun == [((0, 7), "global"), ((0, 8), "thread_local"), (None, "global")]
    assert api.declared == [(0, 7), (0, 8)]


def test_install_wraps_once(graphs):
    module, cuda, api = graphs
    wrapped = cuda.graph_pool_handle
    module.install()
    assert cuda.graph_pool_handle is wrapped
    cuda.graph_pool_handle()
    assert api.declared == [(0, 1)]
