"""The allocscope Python package's modules import each other without a
cycle, counting the imports made inside functions (which hide a cycle from
the interpreter but not from a reader): each module's dependencies come
before it."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "tools" / "python" / "allocscope"


def _module_name(path):
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path, name):
    """The package modules `path` imports, wherever in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            target = (base + "." + node.module if node.module else base) if node.level else node.module
            out.add(target)
            for alias in node.names:
                out.add(target + "." + alias.name)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def _graph():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: sorted(m for m in _imports(path, name) if m in modules and m != name)
        for name, path in modules.items()
    }


def _cycle(graph):
    state = {}

    def visit(node, path):
        state[node] = "open"
        for dep in graph[node]:
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep] if dep in path else [node, dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[node] = "done"
        return None

    for node in graph:
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def test_the_package_is_found_with_its_torch_modules():
    graph = _graph()
    assert "allocscope.torch._bridge" in graph
    assert "allocscope.torch._provenance" in graph["allocscope.torch._naming"]


def test_no_module_imports_itself_through_others_even_inside_functions():
    # A package's __init__ importing its submodules, and they importing the
    # package's names, is the usual layout, not a cycle of modules.
    graph = {
        name: [d for d in deps if not name.startswith(d + ".")] for name, deps in _graph().items()
    }
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_a_cycle_is_found_where_there_is_one():
    assert _cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert _cycle({"a": ["b"], "b": []}) is None
