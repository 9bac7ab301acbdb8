"""The layer rules of docs/architecture.md ("Import rules"), checked by parsing every import (module level
and inside functions) of slime_ext, sglang_patches and megatron_glue. A violation names file and line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("slime_ext", "sglang_patches", "megatron_glue")
DATA_AND_MATH = ("slime_ext.data", "slime_ext.algo")
BASE = DATA_AND_MATH + ("sglang_patches", "slime_ext.config", "slime_ext.rewards", "slime_ext.tasks",
                        "slime_ext.tokenizer", "slime_ext.clients")
# What each part may import of ours (prefix match; longest rule prefix wins). Third-party and stdlib are free,
# except `sglang` for the samplers (below).
ALLOWED: dict[str, tuple[str, ...]] = {
    "slime_ext": (),  # the package roots hold no code
    # the samplers' allow-list of modules comes from the method registry (which imports no method code)
    "sglang_patches": ("sglang_patches", "slime_ext.methods.registry") + DATA_AND_MATH,
    "megatron_glue": ("megatron_glue",) + DATA_AND_MATH,
    "slime_ext.data": DATA_AND_MATH + ("sglang_patches",),
    "slime_ext.algo": DATA_AND_MATH,
    # the config composes its schema from the registry (which imports method code only by name)
    "slime_ext.config": DATA_AND_MATH + ("slime_ext.config", "slime_ext.methods.registry", "slime_ext.envs.registry"),
    # `python -m slime_ext.config --check` is a tool (nothing imports it): it also builds the cluster plan
    "slime_ext.config.__main__": PACKAGES,
    "slime_ext.rewards": BASE,
    "slime_ext.tasks": BASE,
    "slime_ext.tokenizer": BASE,
    "slime_ext.clients": BASE,
    "slime_ext.engine": BASE + ("slime_ext.engine", "megatron_glue"),
    # environments and the multi-turn loop: any engine object is handed in, so no engine module
    # the registry learns from the method registry which tools methods lend (it names code, imports none)
    "slime_ext.envs": BASE + ("slime_ext.envs", "slime_ext.methods.registry"),
    "slime_ext.methods": BASE + ("slime_ext.envs", "slime_ext.methods", "slime_ext.evaluation", "megatron_glue"),
    "slime_ext.evaluation": BASE + ("slime_ext.evaluation",),
    # the server: HTTP over any engine object it is given, so it needs no engine module
    "slime_ext.serving": BASE + ("slime_ext.serving", "slime_ext.methods.registry"),
    # the top: orchestration and the user tools may use everything
    "slime_ext.orchestration": PACKAGES,
    "slime_ext.tools": PACKAGES,
}
# Engine-side adapters that install our samplers into SGLang may import sglang; the samplers themselves
# are plain torch so the embedded engine and SGLang run the same objects.
SGLANG_ADAPTERS = ("sglang_patches.sglang_adapter", "sglang_patches.tandem_model")


# Method code: each method's package and its registered sampler modules. Generic layers learn about a method only
# from the registry, so none of them may import these (issue 29).
GENERIC = ("slime_ext.orchestration", "slime_ext.engine", "slime_ext.serving", "slime_ext.tools", "slime_ext.config",
           "slime_ext.data", "slime_ext.tasks", "slime_ext.evaluation", "slime_ext.clients", "slime_ext.envs",
           "megatron_glue")
# Leaks still open: none. Listed here (module, method module) so that a new one is a visible decision.
KNOWN_LEAKS: set[tuple[str, str]] = set()


def method_modules() -> set[str]:
    """`slime_ext.methods.<package>` of every registered method and every registered sampler module."""
    from slime_ext.methods.registry import METHODS

    out = set()
    for entry in METHODS.values():
        out.add(".".join(entry.method.partition(":")[0].split(".")[:3]))
        out.update(entry.samplers)
        out.update(".".join(p.partition(":")[0].split(".")[:3]) for p in entry.sections.values())
    return out


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> list[tuple[int, str]]:
    """(line, dotted module) of every import; `from a import b` names a.b when b is a module of ours."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                anchor = parts[: len(parts) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((node.lineno, sub if sub in modules else base))
    return out


def _rule(module: str) -> tuple[str, ...]:
    keys = [k for k in ALLOWED if module == k or module.startswith(k + ".")]
    if not keys:
        raise AssertionError(f"{module}: no import rule covers this module; add it to ALLOWED and docs/architecture.md")
    return ALLOWED[max(keys, key=len)]


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def violations(sources: dict[str, tuple[str, str]]) -> list[str]:
    """`sources`: module name -> (file path shown in messages, source text)."""
    problems = []
    modules = set(sources)
    methods = method_modules()
    for module, (shown, text) in sorted(sources.items()):
        allowed = _rule(module)
        is_package = shown.endswith("__init__.py")
        for line, name in sorted(set(imported_modules(ast.parse(text), module, is_package, modules))):
            if name.split(".")[0] == "sglang" and module.startswith("sglang_patches") and module not in SGLANG_ADAPTERS:
                problems.append(f"{shown}:{line}: {module} imports {name} (samplers stay plain torch: no sglang)")
            if not _ours(name) or name == module or name.startswith(module + "."):
                continue
            generic = any(module == g or module.startswith(g + ".") for g in GENERIC)
            owner = next((m for m in methods if name == m or name.startswith(m + ".")), None)
            if generic and owner is not None and (module, name) not in KNOWN_LEAKS:
                problems.append(f"{shown}:{line}: {module} imports {name}, method code ({owner}): generic layers "
                                f"learn about methods from slime_ext.methods.registry only")
                continue
            if not any(name == a or name.startswith(a + ".") for a in allowed):
                problems.append(f"{shown}:{line}: {module} imports {name} (allowed: {', '.join(allowed) or 'nothing of ours'})")
    return problems


def repo_sources() -> dict[str, tuple[str, str]]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            out[module_name(path, REPO)] = (str(path.relative_to(REPO)), path.read_text())
    return out


def test_the_code_follows_the_import_rules():
    problems = violations(repo_sources())
    assert not problems, "import rule violations:\n" + "\n".join(problems)


@pytest.mark.parametrize("module, text, expected", [
    ("sglang_patches.planted", "import torch\n\nfrom slime_ext.orchestration.driver import main\n",
     "sglang_patches/planted.py:3: sglang_patches.planted imports slime_ext.orchestration.driver"),
    ("sglang_patches.planted", "def f():\n    import sglang.srt.utils\n",
     "sglang_patches/planted.py:2: sglang_patches.planted imports sglang.srt.utils (samplers stay plain torch"),
    ("slime_ext.methods.planted.method", "from slime_ext.engine import embedded\n",
     "slime_ext/methods/planted/method.py:1: slime_ext.methods.planted.method imports slime_ext.engine.embedded"),
    ("megatron_glue.planted", "from slime_ext.config.schema import ModelConfig\n",
     "megatron_glue/planted.py:1: megatron_glue.planted imports slime_ext.config.schema"),
    ("slime_ext.engine.planted", "def f():\n    from sglang_patches.duet import DuetGateSampler\n",
     "slime_ext/engine/planted.py:2: slime_ext.engine.planted imports sglang_patches.duet, method code"),
    ("slime_ext.orchestration.planted", "from slime_ext.methods.dapo.method import DAPO\n",
     "slime_ext/orchestration/planted.py:1: slime_ext.orchestration.planted imports slime_ext.methods.dapo.method, "
     "method code"),
])
def test_a_planted_violation_fails_with_file_and_line(module, text, expected):
    shown = module.replace(".", "/") + ".py"
    sources = repo_sources() | {module: (shown, text)}
    problems = violations(sources)
    assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_allowed_imports_pass():
    ok = {"slime_ext.methods.planted.method": ("p.py", "from slime_ext.data import Sample\nfrom sglang_patches.tandem import author_runs\n"),
          "sglang_patches.planted": ("q.py", "from slime_ext.data.sample import Author\nimport torch\n")}
    assert violations(repo_sources() | ok) == []


# -- no import cycles ------------------------------------------------------------------------------------------
# Within a layer the rules above allow any import, so two modules can import each other (at module level, inside a
# function or for types only). A cycle makes the import order matter (a module imported first can meet its partner
# half-initialised) and hides which of the two is the lower one; the shared piece belongs in the lower module.


def import_graph(sources: dict[str, tuple[str, str]]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports anywhere (an imported name resolves to its nearest module)."""
    modules = set(sources)
    graph = {}
    for module, (shown, text) in sources.items():
        deps = set()
        for _, name in imported_modules(ast.parse(text), module, shown.endswith("__init__.py"), modules):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                deps.add(name)
        graph[module] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other through imports (strongly connected components of more than
    one module), each sorted; Tarjan's algorithm, iterative so that deep import chains need no recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return sorted(cycles)


def test_no_module_of_ours_imports_one_that_imports_it_back():
    """Issue 71 named three: methods.base <-> methods.registry, memory_model -> plan_layout -> plan_shape ->
    memory_model, plan <-> plan_format (each fixed by moving the shared piece into the lower module)."""
    cycles = import_cycles(import_graph(repo_sources()))
    assert not cycles, "import cycles (move what both need into the lower module):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_a_planted_cycle_is_found_even_through_a_type_only_import():
    sources = {"slime_ext.x.a": ("a.py", "from slime_ext.x.b import f\n"),
               "slime_ext.x.b": ("b.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from slime_ext.x.c import C\n"),
               "slime_ext.x.c": ("c.py", "def g():\n    from slime_ext.x import a\n"),
               "slime_ext.x": ("x/__init__.py", ""),
               "slime_ext.x.d": ("d.py", "import slime_ext.x.a\n")}
    assert import_cycles(import_graph(sources)) == [["slime_ext.x.a", "slime_ext.x.b", "slime_ext.x.c"]]
