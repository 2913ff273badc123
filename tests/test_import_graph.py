"""Imports point down only: no import cycle in tflm, tools or zoo, and no unexplained import
inside a function in them (issue 40).

The graph is read from the source (AST), not by importing it, so it sees every edge an
import could take: module-level imports, imports inside functions, and module names given as
string literals (`importlib.import_module("tflm.x")`, or tables of module names such as
`zoo/__init__.py`'s `_EXPORTS`), which hide edges from a reader. `from pkg import name` is an
edge to `pkg/name.py` when that module exists, else to `pkg/__init__.py`; so a module that
imports a name from its package while the package's `__init__` imports the module is a cycle.
Imports under `if TYPE_CHECKING:` never run and are not edges.

An import inside a function carries its reason in a comment starting `# deferred:`, at
the end of its line or in the comment lines just above it (or above the run of import lines it
belongs to), for example `import torch  # deferred: optional framework`.
"""

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tflm", "zoo", "tools")
DEFERRED_MARK = "# deferred:"


def module_files(packages=PACKAGES, root=REPO):
    """{module name: path} of every .py file under the `packages` folders of `root`."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def _is_package(name, files):
    return files[name].name == "__init__.py"


def _absolute(module, level, name, files):
    """The absolute name of a relative `from ... import` inside `name`."""
    if not level:
        return module
    parts = name.split(".")
    base = parts if _is_package(name, files) else parts[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _type_checking_block(node):
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _docstrings(tree):
    """The ids of the string constants that stand alone as statements (docstrings)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _walk_runtime(tree):
    """`ast.walk` without the bodies of `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _type_checking_block(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name, files):
    """The modules among `files` that module `name` imports, as [(target, line)]."""
    tree = ast.parse(files[name].read_text(), filename=str(files[name]))
    docstrings = _docstrings(tree)
    edges = []
    for node in _walk_runtime(tree):
        if isinstance(node, ast.Import):
            edges += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, name, files)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                edges.append((submodule if submodule in files else base, node.lineno))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and "." in node.value and node.value in files and id(node) not in docstrings):
            edges.append((node.value, node.lineno))
    return [(target, line) for target, line in edges if target in files and target != name]


def import_graph(files):
    """{module: {imported module: first line}} over `files`."""
    graph = {}
    for name in files:
        targets = {}
        for target, line in imports_of(name, files):
            targets[target] = min(line, targets.get(target, line))
        graph[name] = targets
    return graph


def find_cycles(graph):
    """The import cycles of `graph` ({node: iterable of nodes}): its strongly connected
    components of more than one node, and nodes that import themselves, each a sorted list."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        # Tarjan's algorithm, iterative (recursion would follow the longest import chain).
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    cycles.append(sorted(component))
    return sorted(cycles)


def describe(cycle, graph):
    """A cycle's edges, one per line: `a -> b (line n)`."""
    members = set(cycle)
    return "\n".join(f"  {source} -> {target} (line {line})"
                     for source in cycle for target, line in sorted(graph[source].items())
                     if target in members)


def deferred_imports(name, files):
    """The imports inside functions of module `name` as [(line, text, marked)]: marked when
    a `# deferred:` comment ends the import's line or stands in the comment lines just above
    it, or above the run of import lines it belongs to."""
    source = files[name].read_text()
    lines = source.splitlines()
    imports = {}
    for function in ast.walk(ast.parse(source)):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            imports.update({node.lineno: node for node in ast.walk(function)
                            if isinstance(node, (ast.Import, ast.ImportFrom))})
    ends = {node.end_lineno: node for node in imports.values()}
    found = []
    for line, node in sorted(imports.items()):
        own = DEFERRED_MARK in "".join(lines[line - 1:node.end_lineno])
        first = node
        while True:  # back over the run of imports (blank lines may part them)
            before = first.lineno - 1
            while before > 1 and not lines[before - 1].strip():
                before -= 1
            if before not in ends:
                break
            first = ends[before]
        above = first.lineno - 2
        while above >= 0 and lines[above].strip().startswith("#") and not own:
            own = lines[above].strip().startswith(DEFERRED_MARK)
            above -= 1
        found.append((line, lines[line - 1].strip(), own))
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph(module_files())


def test_find_cycles_on_a_small_graph():
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": [],
             "f": ["f"], "g": ["h"], "h": ["g", "e"]}
    assert find_cycles(graph) == [["a", "b", "c"], ["f"], ["g", "h"]]
    assert find_cycles({"a": ["b"], "b": ["c"], "c": []}) == []


def test_from_package_import_name_goes_to_the_init_or_the_submodule(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg.user import run\nCONSTANT = 1\n")
    (tmp_path / "pkg" / "user.py").write_text(
        "from pkg import CONSTANT\nfrom . import leaf\n\ndef run():\n    import pkg.leaf\n")
    (tmp_path / "pkg" / "leaf.py").write_text(
        '"""pkg.user"""\n\nimport importlib\nNAME = importlib.import_module("pkg.other")\n')
    (tmp_path / "pkg" / "other.py").write_text("")
    graph = import_graph(module_files(("pkg",), tmp_path))
    assert graph == {"pkg": {"pkg.user": 1}, "pkg.user": {"pkg": 1, "pkg.leaf": 2},
                     "pkg.leaf": {"pkg.other": 4}, "pkg.other": {}}
    assert find_cycles(graph) == [["pkg", "pkg.user"]]


def test_deferred_marks_on_the_line_above_the_line_or_above_the_run(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("import os\n")
    (tmp_path / "pkg" / "mod.py").write_text(
        "def f():\n"
        "    import json  # deferred: on its line\n"
        "    # deferred: for the run below,\n"
        "    # over two lines\n"
        "    import csv\n"
        "    from os import (path,\n"
        "                    sep)\n"
        "\n"
        "    import glob\n"
        "    x = 1\n"
        "    import re\n"
        "    # an unrelated comment\n"
        "    import io\n")
    files = module_files(("pkg",), tmp_path)
    assert deferred_imports("pkg", files) == []
    assert deferred_imports("pkg.mod", files) == [
        (2, "import json  # deferred: on its line", True), (5, "import csv", True),
        (6, "from os import (path,", True), (9, "import glob", True), (11, "import re", False),
        (13, "import io", False)]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(graph, package):
    cycles = [cycle for cycle in find_cycles(graph)
              if any(member.split(".")[0] == package for member in cycle)]
    assert not cycles, "import cycles:\n" + "\n\n".join(describe(c, graph) for c in cycles)


def test_tflm_imports_neither_zoo_nor_tools(graph):
    upward = [f"{source} -> {target}" for source, targets in graph.items()
              if source.split(".")[0] == "tflm"
              for target in targets if target.split(".")[0] in ("zoo", "tools")]
    assert not upward


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_inside_functions_say_why(package):
    files = module_files((package,))
    unmarked = [f"{files[name].relative_to(REPO)}:{line}: {text}"
                for name in files for line, text, marked in deferred_imports(name, files)
                if not marked]
    assert not unmarked, (f"imports inside functions without a '{DEFERRED_MARK} <reason>' "
                          "comment (move them to the top, or say why they wait):\n"
                          + "\n".join(unmarked))
