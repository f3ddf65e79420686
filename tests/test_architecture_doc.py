"""docs/architecture.md names the path of a call as ``file:function`` steps: each one exists.

A step written ``Class.method`` alone belongs to the file a step named that class in before,
else to the file named last before it."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
STEP = re.compile(r"`(?:([\w/]+\.py):)?([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)?)`")


def defined(path: pathlib.Path) -> set[str]:
    """``name`` and ``Class.name`` of every function, class and assignment in ``path``."""
    names: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{item.name}")
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(f"{node.name}.{item.target.id}")
    return names


def steps() -> list[tuple[str, str]]:
    found = []
    current: str | None = None
    classes: dict[str, str] = {}
    for match in STEP.finditer(DOC.read_text()):
        file, name = match.groups()
        if file is not None:
            current = file
            classes.setdefault(name.split(".")[0], file)
        elif current is None or "." not in name or name[0].islower():
            continue  # a plain word in backquotes, not a step
        found.append((file or classes.get(name.split(".")[0], current), name))
    return found


def test_every_step_of_the_architecture_doc_exists() -> None:
    found = steps()
    assert len(found) > 40
    missing = [f"{file}:{name}" for file, name in found if name not in defined(ROOT / file)]
    assert not missing
