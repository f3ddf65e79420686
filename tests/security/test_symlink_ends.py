"""The two ends of a path apply walks (issue 29's surviving mutants): the resource folder
itself, and the file's own name, swapped for a symlink to an outside folder or file between
the plan's preparation and its writes (or its rollback). Deterministic: the swap happens at
one known point, with no thread racing it (tests/security/test_symlink_races.py races)."""

from __future__ import annotations

import contextlib
import os
import pathlib

import pytest

from cleveragents.acp.facade.domain.plans import apply
from cleveragents.acp.facade.domain.plans.paths import ResourceRoot
from cleveragents.acp.facade.domain.plans.staging import StagedArtifact
from cleveragents.acp.v1 import plan_pb2

BEFORE = b"the project's file\n"
PLANNED = b"plan wrote this\n"
SENTINEL = b"outside: never touched\n"


def world(tmp_path: pathlib.Path, outside_content: bytes = SENTINEL) -> tuple[pathlib.Path, pathlib.Path]:
    """``repo/f.txt`` (the project's file) and ``outside/f.txt`` (with the same mode)."""
    root, outside = tmp_path / "repo", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "f.txt").write_bytes(BEFORE)
    (outside / "f.txt").write_bytes(outside_content)
    os.chmod(outside / "f.txt", (root / "f.txt").stat().st_mode)
    return root, outside


def staged(content: bytes | None) -> StagedArtifact:
    op = plan_pb2.ARTIFACT_OP_MODIFY if content is not None else plan_pb2.ARTIFACT_OP_DELETE
    return StagedArtifact("repo", "f.txt", op, content, BEFORE, "s")


def prepared(root: pathlib.Path, content: bytes | None) -> list[apply.Write]:
    return apply.prepare([staged(content)], {"repo": ResourceRoot("repo", root)})


def swap_for_link(path: pathlib.Path, target: pathlib.Path) -> None:
    path.rename(path.with_name(path.name + ".moved"))
    path.symlink_to(target)


def outside_intact(outside: pathlib.Path, content: bytes = SENTINEL) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]
    assert (outside / "f.txt").read_bytes() == content


@pytest.mark.parametrize("content", [PLANNED, None], ids=["write", "delete"])
def test_a_resource_folder_become_a_symlink_gets_no_write_and_no_restore(
    tmp_path: pathlib.Path, content: bytes | None
) -> None:
    root, outside = world(tmp_path)
    writes = prepared(root, content)
    swap_for_link(root, outside)
    with pytest.raises(apply.CrossedLinkError):
        apply.write_all(writes)
    outside_intact(outside)
    with contextlib.suppress(OSError):
        apply.restore_all([write.entry for write in writes])
    outside_intact(outside)
    assert (root.with_name("repo.moved") / "f.txt").read_bytes() == BEFORE


@pytest.mark.parametrize("content", [PLANNED, None], ids=["write", "delete"])
def test_a_file_become_a_symlink_is_replaced_or_removed_never_followed(
    tmp_path: pathlib.Path, content: bytes | None
) -> None:
    root, outside = world(tmp_path)
    writes = prepared(root, content)
    swap_for_link(root / "f.txt", outside / "f.txt")
    apply.write_all(writes)
    outside_intact(outside)
    if content is None:
        assert not os.path.lexists(root / "f.txt")
    else:
        assert not (root / "f.txt").is_symlink()
        assert (root / "f.txt").read_bytes() == PLANNED


def test_rollback_puts_the_file_back_over_a_symlink_never_reading_through_it(tmp_path: pathlib.Path) -> None:
    """After apply, ``f.txt`` became a link to an outside file holding the very bytes (and
    mode) of the pre-image: read through the link, the file looks restored already and the
    link would stay; read without following, the link is replaced by the pre-image."""
    root, outside = world(tmp_path, outside_content=BEFORE)
    writes = prepared(root, PLANNED)
    apply.write_all(writes)
    swap_for_link(root / "f.txt", outside / "f.txt")
    outcome = apply.restore_all([write.entry for write in writes])
    assert outcome.restored == ["f.txt"]
    assert not (root / "f.txt").is_symlink()
    assert (root / "f.txt").read_bytes() == BEFORE
    outside_intact(outside, BEFORE)
