"""Opening below a descriptor without following symlinks (facade/domain/beneath.py), with
the kernel's ``openat2`` and with the per-name walk it falls back to, and apply's fence
before a rename."""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import Callable

import pytest

from cleveragents.acp.facade.domain import beneath
from cleveragents.acp.facade.domain.beneath import Anchor
from cleveragents.acp.facade.domain.plans import apply
from cleveragents.acp.facade.domain.plans.paths import ResourceRoot
from cleveragents.acp.facade.domain.plans.staging import StagedArtifact
from cleveragents.acp.v1 import plan_pb2

SECRET = b"outside\n"


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2":
        if not beneath._Kernel.openat2:
            pytest.skip("this kernel has no openat2")
    else:
        monkeypatch.setattr(beneath._Kernel, "openat2", False)
    return str(request.param)


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_bytes(b"inside\n")
    (tmp_path / "outside" / "b").mkdir(parents=True)
    (tmp_path / "outside" / "b" / "f.txt").write_bytes(SECRET)
    (tmp_path / "outside.txt").write_bytes(SECRET)
    return root


def _read(root: pathlib.Path, relative: str, **kwargs: object) -> bytes:
    with beneath.open_anchor(Anchor(str(root))) as fd:
        opened = (
            beneath.open_file(fd, relative, **kwargs)  # type: ignore[arg-type]
            if kwargs
            else beneath.open_at(fd, relative, beneath.FILE_FLAGS)
        )
    with os.fdopen(opened, "rb") as handle:
        return handle.read()


# A symlink where a folder must be: ELOOP (openat2, or O_NOFOLLOW on the last name) or
# ENOTDIR (O_DIRECTORY | O_NOFOLLOW on a symlink).
CROSSED = {errno.ELOOP, errno.ENOTDIR}


def _refused(attempt: Callable[[], object]) -> int:
    """The errno ``attempt`` fails with (it must fail)."""
    try:
        attempt()
    except OSError as exc:
        return exc.errno or 0
    raise AssertionError("opened")


def test_a_symlinked_folder_on_the_way_is_never_followed(mode: str, tree: pathlib.Path) -> None:
    assert _read(tree, "a/b/f.txt") == b"inside\n"
    os.rename(tree / "a", tree / "a.real")
    (tree / "a").symlink_to(tree.parent / "outside")
    assert _refused(lambda: _read(tree, "a/b/f.txt")) in CROSSED


def test_a_folder_swapped_between_two_names_of_the_walk(
    tree: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-name walk, with the swap at the exact moment between opening ``a`` and
    opening ``b``: the descriptor of ``a`` is the real folder, and ``b`` in it is now a
    symlink, which is refused."""
    monkeypatch.setattr(beneath._Kernel, "openat2", False)

    def swap(name: str) -> None:
        if name == "b" and not (tree / "a.real").exists():
            os.rename(tree / "a" / "b", tree / "a" / "b.real")
            (tree / "a" / "b").symlink_to(tree.parent / "outside" / "b")

    monkeypatch.setattr(beneath, "on_component", swap)
    assert _refused(lambda: _read(tree, "a/b/f.txt")) in CROSSED


def test_the_anchor_walks_from_the_operators_root(mode: str, tree: pathlib.Path) -> None:
    anchor = beneath.anchor_below(str(tree.parent), str(tree / "a"))
    assert anchor == Anchor(str(tree.parent), "root/a")
    with beneath.open_anchor(anchor) as fd:
        assert sorted(os.listdir(fd)) == ["b"]
    os.rename(tree, tree.with_name("root.real"))
    tree.symlink_to(tree.parent / "outside")
    assert _refused(lambda: beneath.open_anchor(anchor).__enter__()) in CROSSED
    assert beneath.anchor_below(str(tree), str(tree.parent / "rootx")) is None


def test_a_linked_file_is_followed_only_while_it_stays_inside(mode: str, tree: pathlib.Path) -> None:
    (tree / "inside-link").symlink_to("a/b/f.txt")
    (tree / "a" / "abs-link").symlink_to(tree / "a" / "b" / "f.txt")
    (tree / "up").symlink_to("../outside.txt")
    (tree / "abs-out").symlink_to(tree.parent / "outside.txt")
    assert _read(tree, "inside-link", follow_links=True) == b"inside\n"
    assert _read(tree, "a/abs-link", follow_links=True, folder=str(tree)) == b"inside\n"
    for link in ("up", "abs-out"):
        assert _refused(lambda: _read(tree, link, follow_links=True, folder=str(tree))) == errno.EXDEV  # noqa: B023
    assert _refused(lambda: _read(tree, "inside-link")) == errno.ELOOP


def test_a_kernel_without_openat2_falls_back_to_the_walk(
    tree: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A syscall number no kernel has answers ENOSYS, as openat2 does before Linux 5.6.
    monkeypatch.setattr(beneath, "_OPENAT2", 99999)
    monkeypatch.setattr(beneath._Kernel, "openat2", True)
    assert _read(tree, "a/b/f.txt") == b"inside\n"
    assert beneath._Kernel.openat2 is False


def test_a_fence_that_fails_before_the_rename_leaves_the_target(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "f.txt").write_bytes(b"before\n")
    artifact = StagedArtifact("repo", "f.txt", plan_pb2.ARTIFACT_OP_MODIFY, b"after\n", b"before\n", "s")
    writes = apply.prepare([artifact], {"repo": ResourceRoot("repo", root)})
    calls: list[int] = []

    class FencedError(Exception):
        pass

    def fence() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise FencedError

    with pytest.raises(FencedError):
        apply.write_all(writes, fence)
    # Once before the file, once before its rename: the second stopped it.
    assert len(calls) == 2
    assert sorted(os.listdir(root)) == ["f.txt"]
    assert (root / "f.txt").read_bytes() == b"before\n"
