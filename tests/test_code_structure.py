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
    "errors": 0, "fsio": 0, "randomness": 0, "placement": 0, "bounds": 0,
    "config": 1, "data": 1, "model": 1, "secure": 1, "metrics": 1,
    "transport": 2,
    "node": 3, "steps": 3, "methods": 3,
    "train": 4, "checkpoint": 4, "selection": 4,
    "audit": 5,
    "runtime": 6,
    "simulate": 7, "report": 7, "federation": 7, "cli": 7,
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


def test_nothing_from_another_role_is_unpickled():
    assert not grep(r"send_object_list|recv_object_list|all_gather_object|broadcast_object_list|gather_object"
                    r"|pickle\.loads?\(|import pickle|allow_pickle=True")
    assert not [h for h in grep(r"torch\.load\(") if "weights_only=True" not in h]


def dotted_names(path: Path) -> set[str]:
    """Every dotted name the code uses (`torch.Generator`, `np.random.default_rng`, ...) and every import."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            parts, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                parts, inner = [inner.attr, *parts], inner.value
            if isinstance(inner, ast.Name):
                names.add(".".join([inner.id, *parts]))
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
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
