"""The package's structure, checked: layered imports, short functions, protocols asked rather than named,
and the security rules that a reader can check by reading (no pickle between roles, no unsafe load, no
non-cryptographic generator where secrets are drawn)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "falsevfl_secure"

# Lower layers never import higher ones (README, "Layout").
LAYERS: dict[str, int] = {
    "errors": 0, "fsio": 0, "randomness": 0, "placement": 0, "bounds": 0, "heap": 0,
    "config": 1, "privacy": 1, "data": 1, "model": 1, "secure": 1, "metrics": 1,
    "network": 2,
    "transport": 3,
    "node": 4, "methods": 4,
    "train": 5, "checkpoint": 5, "selection": 5, "cached_stage": 5, "passes": 5, "reference": 5,
    "audit": 6, "clip_proposal": 6,
    "runtime": 7,
    "simulate": 8, "report": 8, "federation": 8, "cli": 8,
}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def layer_of(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, package-relative module) of every import of this package in `path`."""
    tree, here = ast.parse(path.read_text()), path.relative_to(PACKAGE).with_suffix("").parts
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(here[:-node.level]) + (node.module.split(".") if node.module else [])
            names = [base] if node.module else [base + [a.name] for a in node.names]
            found += [(node.lineno, ".".join(n)) for n in names if n]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("falsevfl_secure."):
            found.append((node.lineno, node.module.removeprefix("falsevfl_secure.")))
    return found


def test_every_module_has_a_layer_and_no_module_imports_a_higher_layer():
    upward = []
    for path in modules():
        own = layer_of(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        for line, module in imported(path):
            if layer_of(module) > own:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} imports {module} (layer {layer_of(module)} > {own})")
    assert not upward, "\n".join(upward)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (deferred imports included; a package is its __init__)."""
    names = {".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__") for p in modules()}
    graph: dict[str, set[str]] = {}
    for path in modules():
        me = ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
        targets = set()
        for _, module in imported(path):
            while module and module not in names:  # `from .x import name`: name is not a module
                module = module.rpartition(".")[0]
            if module and module != me:
                targets.add(module)
        graph[me] = targets
    return graph


def import_cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph, index, low, stack, on, found = import_graph(), {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_the_packages_modules():
    assert not import_cycles(), import_cycles()


def test_the_network_package_knows_nothing_of_rounds_tensors_or_methods():
    for path in (PACKAGE / "network").rglob("*.py"):
        assert not {n for n in dotted_names(path) if n.split(".")[0] in ("torch", "numpy")}, path
        assert not [m for _, m in imported(path) if m.split(".")[0] in ("transport", "methods", "node")]


def long_functions(limit: int = 40) -> list[str]:
    """Functions whose body (docstring excluded) spans more than `limit` lines."""
    rows = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                if body and body[-1].end_lineno - body[0].lineno + 1 > limit:
                    rows.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    return rows


def test_no_function_is_longer_than_40_lines():
    assert not long_functions(), long_functions()


def grep(pattern: str, where: Path = PACKAGE) -> list[str]:
    hits = []
    for path in sorted(where.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                hits.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    return hits


def test_protocols_are_asked_not_named():
    assert not [h for h in grep(r"protocol ?== ?['\"]") if not h.startswith("transport/protocols.py")]


def compared_with(names: set[str]) -> list[str]:
    """Where the package compares anything (==, !=, in, is) with one of `names` written out as a string."""
    hits = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                written = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)} & names
                hits += [f"{path.relative_to(PACKAGE)}:{node.lineno} {sorted(written)}"] if written else []
    return hits


def test_no_method_protocol_or_dataset_is_branched_on_by_name():
    """A method, protocol or dataset declares what differs (registries: methods.METHODS, transport.PROTOCOLS,
    data.DATASETS); no code asks which one it is by name."""
    from falsevfl_secure.data.loaders import DATASETS
    from falsevfl_secure.methods import METHODS, method_labels
    from falsevfl_secure.transport.protocols import PROTOCOLS

    # (LASER-VFL's `laser_batches = "plain"` is one of its own options' values, not the protocol)
    choices = {c for method in METHODS.values() for option in method.options.values() for c in option.choices}
    names = {*METHODS, *method_labels(), *PROTOCOLS, *DATASETS} - choices
    assert not compared_with(names), compared_with(names)


UNPICKLING = (r"send_object_list|recv_object_list|all_gather_object|broadcast_object_list|gather_object"
              r"|pickle\.loads?\(|Unpickler|import _?pickle|from _?pickle import|read_pickle|joblib\.load"
              r"|import dill|import shelve|allow_pickle\s*=\s*True")


def test_nothing_from_another_role_is_unpickled():
    assert not grep(UNPICKLING)
    assert not [h for h in grep(r"torch\.load\(") if "weights_only=True" not in h]


def test_the_static_checks_see_every_spelling():
    """Not vacuous: each forbidden form, however imported, is seen by the checks above and below."""
    for line in ("import pickle", "from pickle import loads", "pickle.load(f)", "import dill", "import _pickle",
                 "np.load(path, allow_pickle = True)", "dist.broadcast_object_list(x)", "pickle.Unpickler(f)",
                 "pd.read_pickle(path)", "joblib.load(path)"):
        assert re.search(UNPICKLING, line), line
    source = ("import random\nfrom random import getrandbits\nfrom numpy.random import default_rng\n"
              "from torch import randn\nimport numpy.random\nx = torch.Generator()\n"
              "import numpy as xp\ny = xp.random.default_rng()\nimport torch as t\nz = t.manual_seed(0)\n")
    used = {n for n in dotted_names(source) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)}
    assert {"random", "random.getrandbits", "numpy.random.default_rng", "torch.randn", "numpy.random",
            "torch.Generator", "torch.manual_seed"} <= used, used


def dotted_names(source: Path | str) -> set[str]:
    """Every dotted name the code uses (`torch.Generator`, `np.random.default_rng`, ...) and every import,
    `from a.b import c` as `a.b` and `a.b.c`; a name under an alias (`import numpy as xp`) also as the module's."""
    tree = ast.parse(source.read_text() if isinstance(source, Path) else source)
    aliases = {a.asname: a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
               if a.asname and a.asname != "np"}  # np: FORBIDDEN and the allowed names spell it already
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                parts, inner = [inner.attr, *parts], inner.value
            if isinstance(inner, ast.Name):
                names |= {".".join([inner.id, *parts]), ".".join([aliases.get(inner.id, inner.id), *parts])}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


FORBIDDEN = {"torch.Generator", "torch.manual_seed", "torch.rand", "torch.randn", "torch.randint", "np.random",
             "numpy.random", "random"}


def test_no_non_cryptographic_generator_where_secrets_are_drawn():
    """Where secrets are drawn (the secure layer, the randomness policy, models and their initialisation)
    only `randomness.KeyStream` (AES-CTR) and the audited libraries draw random numbers."""
    secret_code = [*(PACKAGE / "secure").rglob("*.py"), PACKAGE / "randomness.py", PACKAGE / "node.py",
                   *(PACKAGE / "model").rglob("*.py"), *(PACKAGE / "methods").rglob("*.py")]
    for path in secret_code:
        used = {n for n in dotted_names(path) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)}
        allowed = {"np.random", "np.random.SeedSequence", "np.random.default_rng", "np.random.Generator"} \
            if path.name == "randomness.py" else set()  # public_rng: the batch order and simulated splits only
        assert used <= allowed, (path, used - allowed)


def unhosted_numpy(source: str) -> list[int]:
    """Lines where a tensor becomes an array without first being moved to the host (`.cpu()` or
    `.to("cpu", ...)`): on a party's GPU that call raises (found on a lent H200: the federation's validation)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "numpy":
            inner = node.func.value
            hosted = isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and (
                inner.func.attr == "cpu" or inner.func.attr == "to" and bool(inner.args)
                and isinstance(inner.args[0], ast.Constant) and inner.args[0].value == "cpu")
            found += [] if hosted else [node.lineno]
    return found


def test_every_tensor_reaches_numpy_through_the_host():
    """Models, methods and the federation may run on a GPU (`[model] device`); the transport and the secure
    layer see host tensors only (the rounds move a value to the host before a cipher reads it)."""
    wire = {PACKAGE / "transport", PACKAGE / "secure"}
    bad = [f"{p.relative_to(PACKAGE)}:{line}" for p in modules() if not wire & set(p.parents)
           for line in unhosted_numpy(p.read_text())]
    assert not bad, bad
    assert unhosted_numpy("a = t.get().numpy()\nb = t.cpu().numpy()\nc = t.to('cpu', torch.float64).numpy()\n"
                          "d = t.to(x).numpy()\n") == [1, 4]
