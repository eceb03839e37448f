"""The package's import graph has no circles (issue 31: ``cli`` <-> ``bench.cli`` and
``devices`` -> ``cuda`` -> ``profiler`` -> ``devices`` were two).

Every ``import`` of an ``av_infer`` module counts, at module level or inside a function
(a lazy import is still a dependency); imports under ``if TYPE_CHECKING:`` do not (they
never run). A circle is a strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "av_infer"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and getattr(n.test, "id", getattr(n.test, "attr", "")) \
                == "TYPE_CHECKING":
            for b in n.body:
                skip |= {id(x) for x in ast.walk(b)}
    return skip


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text(), filename=str(p))
        skip = _type_checking_nodes(tree)
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for n in ast.walk(tree):
            if id(n) in skip:
                continue
            targets: list[str] = []
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in n.names]
            for t in targets:
                if t == "av_infer" or t.startswith("av_infer."):
                    o = owner(t)
                    if o and o != m:
                        edges[m].add(o)
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_graph_sees_lazy_imports() -> None:
    edges = _edges(_modules())
    # cli imports the bench CLI inside a function: still an edge
    assert "av_infer.bench.cli" in edges["av_infer.cli"]


def test_no_import_circles() -> None:
    circles = _circles(_edges(_modules()))
    assert not circles, f"import circles: {circles}"


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_runs_up_a_floor() -> None:
    """The floors, bottom up: the compiled hot paths (``_cy``), the devices, the scheduler,
    the runtime. A device never imports the scheduler (``devices/cpu.py`` once reached into
    ``sched/stats.py``), nor the scheduler the runtime's modules."""
    edges = _edges(_modules())
    above = {"av_infer.devices": ("av_infer.sched", "av_infer.runtime", "av_infer.engine",
                                  "av_infer.registry"),
             "av_infer.sched": ("av_infer.runtime", "av_infer.engine", "av_infer.registry",
                                "av_infer.request_options", "av_infer.inputs")}
    bad = [(m, t) for m, ts in edges.items() for floor, ups in above.items()
           if m == floor or m.startswith(floor + ".")
           for t in ts if any(t == u or t.startswith(u + ".") for u in ups)]
    assert not bad, bad
