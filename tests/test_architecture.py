"""The house by stages (STYLE.md 13): the import graph, read from the code with ast, has no circle, no import from
a stage to a later one, and no torch reachable from report/ or engines/. The checker is scripts/house_graph.py;
the negative tests build small packages that break each rule and show the checker names the break."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph():
    spec = importlib.util.spec_from_file_location("house_graph", ROOT / "scripts" / "house_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["house_graph"] = module
    spec.loader.exec_module(module)
    return module


def write_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in [pkg, *[p for p in pkg.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return pkg


def test_the_package_has_no_circle_no_arrow_up_and_no_torch_under_the_report(graph):
    house = graph.read_house(ROOT / "mtp_observe")
    assert house.problems() == []


def test_every_module_of_the_package_lives_in_a_stage_or_is_one_of_the_shared_leaves(graph):
    house = graph.read_house(ROOT / "mtp_observe")
    top = sorted(name for name, m in house.modules.items() if m.stage == graph.SHARED and name)
    assert top == ["errors", "jsonfiles", "literal", "outputs", "wording"]
    assert {m.stage for m in house.modules.values()} - {graph.SHARED} == set(graph.STAGES)


def test_every_stage_states_its_contract_in_its_init(graph):
    for stage in graph.STAGES:
        init = ROOT / "mtp_observe" / stage / "__init__.py"
        doc = init.read_text().lstrip()
        assert doc.startswith('"""') and "Contract" in doc.split('"""')[1] or stage in ("cli", "report"), stage
        assert len(doc.split('"""')[1].strip()) > 200, f"{stage}/__init__.py has no contract paragraph"


def test_no_module_is_over_about_700_lines_and_no_function_over_about_80(graph):
    house = graph.read_house(ROOT / "mtp_observe")
    assert house.long_modules(720) == []
    assert house.long_functions(90) == []


def test_a_circle_is_found_even_when_one_side_imports_inside_a_function(graph, tmp_path):
    pkg = write_package(tmp_path, {
        "run/a.py": "from .b import f\n",
        "run/b.py": "def f():\n    from .a import g\n",
    })
    house = graph.read_house(pkg)
    assert house.circles() == [["run.a", "run.b"]]
    assert any(p.startswith("circle: run.a <-> run.b") for p in house.problems())


def test_a_circle_through_type_checking_imports_is_a_circle(graph, tmp_path):
    pkg = write_package(tmp_path, {
        "report/a.py": "from .b import X\n",
        "report/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import Y\n",
    })
    assert graph.read_house(pkg).circles() == [["report.a", "report.b"]]


def test_an_import_from_an_earlier_stage_to_a_later_one_is_an_arrow_up(graph, tmp_path):
    pkg = write_package(tmp_path, {
        "sessions/reading.py": "from ..run.tables import SCHEMA\n",
        "run/tables.py": "SCHEMA = 1\n",
        "report/run.py": "from ..run import tables\n",  # later -> earlier: allowed
    })
    house = graph.read_house(pkg)
    # importing run.tables runs run/__init__ first: an arrow to both
    assert house.arrows_up() == [("sessions.reading", "run"), ("sessions.reading", "run.tables")]
    assert "arrow up: sessions.reading (sessions) imports run.tables (run)" in house.problems()


def test_a_shared_leaf_that_imports_a_stage_is_an_arrow_up(graph, tmp_path):
    pkg = write_package(tmp_path, {"errors.py": "from .model.families import X\n", "model/families.py": "X = 1\n"})
    assert ("errors", "model.families") in graph.read_house(pkg).arrows_up()


def test_torch_reachable_from_the_report_through_another_stage_is_found_with_its_chain(graph, tmp_path):
    pkg = write_package(tmp_path, {
        "report/summary.py": "from ..cost.speedup import best_k\n",
        "cost/speedup.py": "def best_k():\n    from ..model.checkpoint import read\n",
        "model/checkpoint.py": "def read():\n    import torch\n",
    })
    reach = graph.read_house(pkg).torch_reach()
    assert reach == {"report.summary": ["report.summary", "cost.speedup", "model.checkpoint", "torch"]}


def test_torch_reachable_through_a_package_init_is_found(graph, tmp_path):
    pkg = write_package(tmp_path, {
        "report/run.py": "from ..model.families import X\n",
        "model/families.py": "X = 1\n",
    })
    (pkg / "model" / "__init__.py").write_text("from .loading import load\n")
    (pkg / "model" / "loading.py").write_text("import transformers\n\ndef load():\n    pass\n")
    reach = graph.read_house(pkg).torch_reach()
    assert reach["report.run"][-1] == "transformers"


def test_a_clean_package_has_no_problem(graph, tmp_path):
    pkg = write_package(tmp_path, {
        "sessions/reading.py": "from ..errors import UserError\n",
        "model/target.py": "import torch\nfrom ..sessions.reading import UserError\n",
        "report/run.py": "import numpy\nfrom ..sessions import reading\n",
        "errors.py": "class UserError(Exception):\n    pass\n",
    })
    assert graph.read_house(pkg).problems() == []


def test_an_import_of_a_module_the_package_does_not_have_is_named(graph, tmp_path):
    pkg = write_package(tmp_path, {"report/run.py": "def f():\n    from ..precisions import PRECISIONS\n"})
    assert graph.read_house(pkg).problems() == ["unresolved: report.run imports pkg.precisions, which is no module of "
                                                "the package"]


def test_the_library_pages_example_and_table_name_what_exists():
    """docs/library.md: its example's imports and the functions its stage table names are the package's (the example
    itself was run by hand: it replays the demo, about 50 s here)."""
    import ast
    import importlib
    import re

    page = (ROOT / "docs" / "library.md").read_text()
    [example] = re.findall(r"```python\n(.*?)```", page, re.S)
    for node in ast.walk(ast.parse(example)):
        if isinstance(node, ast.ImportFrom) and node.module.startswith("mtp_observe"):
            module = importlib.import_module(node.module)
            assert all(hasattr(module, a.name) for a in node.names), node.module
    stages = {}
    for row in re.findall(r"^\| `(mtp_observe\.\w+)` \|[^|]*\| (.*) \|$", page, re.M):
        stages[row[0]] = re.findall(r"`(\w+)`", row[1])
    assert len(stages) == 8
    for stage, names in stages.items():
        package = ROOT / stage.replace(".", "/")
        defined = set()
        for path in package.rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    defined.add(node.name)
        assert set(names) <= defined, (stage, set(names) - defined)
