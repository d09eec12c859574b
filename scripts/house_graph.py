"""The house's shape, measured from the code's own imports: stages, files, lines, arrows, circles.

    python scripts/house_graph.py            # the table for mtp_observe/
    python scripts/house_graph.py --json     # the same figures as JSON
    python scripts/house_graph.py --check    # exit 1 on a circle, an arrow up, or torch reachable from report/engines

The graph is read with `ast`, never from a hand-written list: every `import` and `from ... import` in a module counts,
wherever it stands (a function-level import that dodges a circle is still an arrow; so is one under TYPE_CHECKING).
A module's *stage* is its first folder under the package (`mtp_observe/run/pipeline.py` is in `run`); a module at the
top of the package is a shared leaf (errors, literal text, wording) unless LEGACY names the stage it belongs to
(LEGACY lets this script measure the flat layout the stages replaced, for the before/after figures).

Figures:
- files and lines per stage;
- arrows: distinct module -> module imports inside the package;
- circles: strongly connected components of the module graph with more than one module (or a self-import);
- floors: the longest import chain, counted in modules, over the graph with its circles contracted;
- arrows up: an import from a stage to a later stage in STAGES (a shared leaf importing a stage counts too);
- torch: which modules of `report` and `engines` reach torch (or transformers, accelerate) through any import chain.

tests/test_architecture.py runs `check` on the real package and on small packages built to break each rule.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The stages in pipeline order: a stage imports only the shared leaves and the stages before it.
STAGES = ("sessions", "model", "drafting", "cost", "run", "report", "engines", "cli")
# Packages (third-party) that count as torch for "the report imports no torch".
TORCH_LIKE = ("torch", "transformers", "accelerate", "safetensors.torch")
# Stages that must not reach torch.
TORCH_FREE = ("report", "engines")

# The flat layout before the stages (bf66717): each top-level module named by the stage it moved to.
LEGACY = {
    "sessions": "sessions", "rendering": "sessions", "importers": "sessions",
    "hub": "model", "checkpoint": "model", "families": "model", "target": "model", "mtp": "model",
    "fp8": "model", "quantisers": "model", "precisions": "model", "routing": "model", "kernels": "model",
    "synthetic": "model", "serving": "model",
    "acceptance": "drafting", "drafters": "drafting", "tree": "drafting", "tree_acceptance": "drafting",
    "layer_rules": "drafting", "head_variants": "drafting", "whatif_heads": "drafting",
    "pipeline": "run", "estimate": "run", "generation": "run", "parts": "run", "tables": "run",
    "manifest": "run", "shards": "run", "merge": "run", "ranks": "run", "cluster": "run",
    "progress": "run", "memory": "run",
    "cost": "cost", "inventory": "cost", "denominator": "cost", "probe": "cost",
    "report": "report", "metrics": "report", "presentation": "report", "plotting": "report",
    "heatmap": "report", "tree_tables": "report",
    "engines": "engines", "counters": "engines", "engine_check": "engines",
    "cli": "cli", "__main__": "cli",
}
SHARED = "(shared)"


@dataclass(frozen=True)
class Module:
    name: str          # dotted, without the package: "run.pipeline", "errors"
    path: Path
    lines: int
    stage: str         # a STAGES name, or SHARED


@dataclass
class House:
    package: str
    modules: dict[str, Module]                                   # name -> module
    arrows: set[tuple[str, str]]                                 # (importer, imported), both module names
    external: dict[str, set[str]] = field(default_factory=dict)  # module -> third-party top names it imports
    stages: tuple[str, ...] = STAGES
    unresolved: list[str] = field(default_factory=list)  # imports of a module the package does not have

    # -- derived figures ---------------------------------------------------------------------------------
    def circles(self) -> list[list[str]]:
        return [sorted(c) for c in _components(self.modules, self.arrows) if len(c) > 1 or (c[0], c[0]) in self.arrows]

    def arrows_up(self) -> list[tuple[str, str]]:
        order = {s: i for i, s in enumerate(self.stages)}
        out = []
        for a, b in sorted(self.arrows):
            sa, sb = self.modules[a].stage, self.modules[b].stage
            if sb == SHARED or sa == sb:
                continue
            if sa == SHARED or order[sb] > order[sa]:
                out.append((a, b))
        return out

    def floors(self) -> int:
        comps = _components(self.modules, self.arrows)
        comp_of = {m: i for i, c in enumerate(comps) for m in c}
        succ: dict[int, set[int]] = {i: set() for i in range(len(comps))}
        for a, b in self.arrows:
            if comp_of[a] != comp_of[b]:
                succ[comp_of[a]].add(comp_of[b])
        depth: dict[int, int] = {}

        def d(i: int) -> int:
            if i not in depth:
                depth[i] = 1 + max((d(j) for j in succ[i]), default=0)
            return depth[i]

        sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
        return max((d(i) for i in succ), default=0)

    def torch_reach(self) -> dict[str, list[str]]:
        """module of a TORCH_FREE stage -> the import chain that reaches torch (empty dict: none does)."""
        found = {}
        for name, mod in sorted(self.modules.items()):
            if mod.stage not in TORCH_FREE:
                continue
            chain = self._path_to_torch(name)
            if chain:
                found[name] = chain
        return found

    def _path_to_torch(self, start: str) -> list[str]:
        succ: dict[str, list[str]] = {}
        for a, b in sorted(self.arrows):
            succ.setdefault(a, []).append(b)
        seen, queue, parent = {start}, [start], {}
        while queue:
            m = queue.pop(0)
            hit = next((t for t in TORCH_LIKE if t in self.external.get(m, ())), None)
            if hit:
                chain = [m]
                while chain[-1] != start:
                    chain.append(parent[chain[-1]])
                return list(reversed(chain)) + [hit]
            for n in succ.get(m, ()):
                if n not in seen:
                    seen.add(n)
                    parent[n] = m
                    queue.append(n)
        return []

    def per_stage(self) -> dict[str, tuple[int, int]]:
        out: dict[str, list[int]] = {}
        for mod in self.modules.values():
            row = out.setdefault(mod.stage, [0, 0])
            row[0] += 1
            row[1] += mod.lines
        order = list(self.stages) + [SHARED]
        return {s: tuple(out[s]) for s in sorted(out, key=lambda s: order.index(s) if s in order else len(order))}

    def top_level(self) -> tuple[int, int]:
        """(top-level modules, top-level packages) of the package."""
        mods = {m.name.split(".")[0] for m in self.modules.values() if "." not in m.name and m.path.name != "__init__.py"}
        pkgs = {m.name.split(".")[0] for m in self.modules.values() if "." in m.name or m.path.name == "__init__.py"}
        pkgs.discard("")
        return len(mods - pkgs), len(pkgs)

    def long_modules(self, limit: int = 700) -> list[tuple[str, int]]:
        return sorted(((m.name, m.lines) for m in self.modules.values() if m.lines > limit), key=lambda r: -r[1])

    def long_functions(self, limit: int = 80) -> list[tuple[str, int]]:
        rows = []
        for mod in self.modules.values():
            for node in ast.walk(ast.parse(mod.path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > limit:
                        rows.append((f"{mod.name}.{node.name}", n))
        return sorted(rows, key=lambda r: -r[1])

    def problems(self) -> list[str]:
        out = [f"unresolved: {u}" for u in self.unresolved]
        out += [f"circle: {' <-> '.join(c)}" for c in self.circles()]
        out += [f"arrow up: {a} ({self.modules[a].stage}) imports {b} ({self.modules[b].stage})" for a, b in self.arrows_up()]
        out += [f"torch reachable from {m}: {' -> '.join(chain)}" for m, chain in self.torch_reach().items()]
        return out

    def figures(self) -> dict:
        mods, pkgs = self.top_level()
        return {
            "files": len(self.modules), "lines": sum(m.lines for m in self.modules.values()),
            "top_level_modules": mods, "top_level_packages": pkgs,
            "per_stage": {s: {"files": f, "lines": n} for s, (f, n) in self.per_stage().items()},
            "arrows": len(self.arrows), "floors": self.floors(), "circles": self.circles(),
            "arrows_up": [list(a) for a in self.arrows_up()], "torch_reach": self.torch_reach(),
            "modules_over_700": self.long_modules(), "functions_over_80": self.long_functions(),
        }


def read_house(root: Path, stages: tuple[str, ...] = STAGES, legacy: dict[str, str] | None = None) -> House:
    """The import graph of the package at `root` (a directory holding __init__.py)."""
    legacy = LEGACY if legacy is None else legacy
    package = root.name
    modules: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        first = parts[0] if parts else ""
        if len(rel.parts) > 1 and first in stages:
            stage = first
        elif first == "__main__":
            stage = "cli"
        elif first in legacy:
            stage = legacy[first]
        else:
            stage = SHARED
        modules[name] = Module(name, path, len(path.read_text().splitlines()), stage)
    arrows: set[tuple[str, str]] = set()
    external: dict[str, set[str]] = {}
    unresolved: list[str] = []
    for name, mod in modules.items():
        is_pkg = mod.path.name == "__init__.py"
        for target, members in _imports(ast.parse(mod.path.read_text()), name, is_pkg, package):
            if target.startswith(package + ".") and target[len(package) + 1:] not in modules:
                unresolved.append(f"{name} imports {target}, which is no module of the package")
            if target.startswith(package + ".") or target == package:
                inner = [m[len(package) + 1:] for m in members if m[len(package) + 1:] in modules]
                subs = [m[len(package) + 1:] for m in members]
                hits = inner if len(inner) == len(subs) and inner else [target[len(package) + 1:] if target != package else ""]
                for hit in (_resolve(h, modules) for h in hits):
                    if hit is None or hit == name:
                        continue
                    arrows.add((name, hit))
                    # importing a.b.c runs a/__init__ and a/b/__init__ first: arrows to those packages too,
                    # except the importer's own (a module's own package is already running when it runs)
                    parts = hit.split(".")
                    own = set(_prefixes(name)) | {""}
                    for i in range(1, len(parts)):
                        parent = ".".join(parts[:i])
                        if parent in modules and parent not in own:
                            arrows.add((name, parent))
            else:
                external.setdefault(name, set()).update(_prefixes(target))
                external[name].update(p for m in members for p in _prefixes(m))
    return House(package, modules, arrows, external, stages, sorted(set(unresolved)))


def _prefixes(dotted: str) -> set[str]:
    parts = dotted.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _resolve(inner: str, modules: dict[str, Module]) -> str | None:
    """The module a dotted name inside the package lands on (the longest prefix that is a module)."""
    parts = inner.split(".") if inner else []
    for i in range(len(parts), -1, -1):
        cand = ".".join(parts[:i])
        if cand in modules:
            return cand
    return None


def _imports(tree: ast.AST, name: str, is_pkg: bool, package: str):
    """(absolute dotted target, its imported members) for every import statement in a module."""
    here = [package] + (name.split(".") if name else [])
    if not is_pkg:
        here = here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else list(here)
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import name`: an arrow to pkg.name where that is a module, else to pkg
            yield mod, tuple(f"{mod}.{a.name}" for a in node.names if a.name != "*")


def _components(modules, arrows) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    succ: dict[str, list[str]] = {m: [] for m in modules}
    for a, b in arrows:
        succ[a].append(b)
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(succ[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
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
                comps.append(comp)
    return comps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1] / "mtp_observe"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    house = read_house(Path(args.root))
    figures = house.figures()
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        mods, pkgs = house.top_level()
        print(f"{figures['files']} files, {figures['lines']:,} lines; top level: {mods} modules, {pkgs} packages")
        print(f"{'stage':<10} {'files':>5} {'lines':>7}")
        for s, row in figures["per_stage"].items():
            print(f"{s:<10} {row['files']:>5} {row['lines']:>7,}")
        print(f"arrows {figures['arrows']}, floors {figures['floors']}, circles {len(figures['circles'])}, "
              f"arrows up {len(figures['arrows_up'])}, modules reaching torch from {'/'.join(TORCH_FREE)}: "
              f"{len(figures['torch_reach'])}")
        for c in figures["circles"]:
            print("  circle:", " <-> ".join(c))
        for a, b in figures["arrows_up"]:
            print(f"  up: {a} -> {b}")
        for m, chain in figures["torch_reach"].items():
            print(f"  torch: {' -> '.join(chain)}")
        print("modules over 700 lines:", ", ".join(f"{n} {l}" for n, l in figures["modules_over_700"]) or "none")
        print("functions over 80 lines:", ", ".join(f"{n} {l}" for n, l in figures["functions_over_80"]) or "none")
    if args.check:
        problems = house.problems()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
