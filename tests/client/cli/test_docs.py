"""The documentation cannot drift: docs/cli.md's exit status table is the errors TABLE, and
the README's quick tour runs as printed."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from cleveragents.acp.client.cli.exits import (
    EXIT_AWAITING_APPROVAL,
    EXIT_INTERRUPTED,
    EXIT_PLAN_FAILED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from cleveragents.acp.contract.errors import TABLE
from tests.client.cli.conftest import CLI_TIMEOUT, Cli, clean_env

ROOT = pathlib.Path(__file__).resolve().parents[3]
TOUR_DIR = "/tmp/acp-tour"


def test_exit_status_table_is_the_errors_table() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", section, re.MULTILINE))
    codes = {int(status): meaning.strip("`") for status, meaning in rows.items() if meaning.startswith("`")}
    assert codes == {mapping.exit_code: code for code, mapping in TABLE.items()}
    others = {int(status) for status, meaning in rows.items() if not meaning.startswith("`")}
    assert others == {
        0,
        EXIT_PLAN_FAILED,
        EXIT_USAGE,
        EXIT_UNREACHABLE,
        EXIT_AWAITING_APPROVAL,
        EXIT_INTERRUPTED,
    }


def _tour() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Quick tour with the CLI", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    assert readme.index("make test") < readme.index("### Quick tour with the CLI")
    return block


def test_readme_tour_runs_as_printed(tmp_path: pathlib.Path) -> None:
    tour = _tour()
    commands = [line for line in tour.splitlines() if "agents " in line]
    assert len(commands) == 5, commands
    bin_dir = pathlib.Path(sys.executable).parent
    assert (bin_dir / "agents").exists()
    env = clean_env(tmp_path)
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    where = str(tmp_path / "acp-tour")
    script = tour.replace(TOUR_DIR, where) + 'echo "plan=$PLAN"\n'
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT * 2,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "state: succeeded" in done.stdout
    plan_id = done.stdout.rsplit("plan=", 1)[1].strip()

    # What the text after the block promises.
    cli = Cli("local", {**env, "ACP_DB": f"{where}/acp.db"}, tmp_path)
    assert "+Hello, World!" in cli("plan", "diff", plan_id).out
    cli("plan", "apply", plan_id)
    assert (tmp_path / "acp-tour" / "site" / "hello.txt").read_text() == "Hello, World!\n"
    cli("plan", "rollback", plan_id)
    assert not (tmp_path / "acp-tour" / "site" / "hello.txt").exists()


def test_readme_leads_to_every_doc_and_says_what_a_newcomer_asks() -> None:
    """Issue 29: the README linked neither actors, plans, sessions nor events, nor said how
    long ``make test`` runs or how to serve on other ports."""
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"](docs/{p.name})" not in readme]
    assert unlinked == []
    assert "`make test` takes about 13 minutes on 2 cores" in readme
    assert 'make serve SERVE_FLAGS="--http-port 9080 --grpc-port 0"' in readme
