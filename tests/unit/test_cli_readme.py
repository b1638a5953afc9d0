"""README.md stays true: the two set-up commands, the configuration table, the examples it quotes."""

from __future__ import annotations

import re
from pathlib import Path

from services.cli import build_parser
from shared.settings import markdown_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
INSTALL = 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && loopwire demo'
TEST = "python -m pytest -q"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", README, re.M | re.S)


def test_the_two_setup_commands_come_first() -> None:
    first, second = _blocks("bash")[:2]
    assert first.strip() == INSTALL
    assert second.strip() == TEST
    assert README.index(INSTALL) < README.index("## How it works")


def test_ci_runs_the_readme_commands() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    install = INSTALL.split(" && ")[2]  # CI installs like the README (the demo runs in tests/system)
    assert install in ci and TEST in ci


def test_configuration_table_is_the_declarations() -> None:
    section = README[README.index("## Configuration") :]
    table = markdown_table()
    assert table in section, f"README's table must be shared.settings.markdown_table():\n{table}"
    rows = re.findall(r"^\| `((?:LW|OTEL)_[A-Z0-9_]+)` \|", section.split("\n## ")[0], re.M)
    assert len(rows) == table.count("\n") - 2  # and no other variable row


def test_add_a_tool_is_the_example_file() -> None:
    section = README[README.index("## Add a tool in 10 lines") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    assert code.group(1) == (ROOT / "examples" / "add_a_tool.py").read_text()


def test_follow_steps_example_is_quoted_and_short() -> None:
    text = (ROOT / "examples" / "follow_steps.py").read_text()
    assert len(text.splitlines()) < 30
    main = text[text.index("async def main") : text.index("asyncio.run") + len("asyncio.run(main())\n")]
    assert main in README


def test_every_command_the_readme_mentions_exists() -> None:
    parser = build_parser()
    commands = {a for a in parser._subparsers._group_actions[0].choices}  # type: ignore[union-attr]
    mentioned = set(re.findall(r"(?<!from )\bloopwire ([a-z][a-z-]+)", README))  # not Python's from loopwire import
    assert mentioned <= commands, mentioned - commands


def test_the_command_table_lists_every_command() -> None:
    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    table = README[README.index("| command | what it does |") :]
    table = table[: table.index("\n\n")]
    listed = set(re.findall(r"`loopwire ([a-z][a-z-]+)", table)) | set(
        re.findall(r"(?:`|, )([a-z]+) (?:GATE|LOOP)", table)
    )
    assert commands <= listed, commands - listed
    assert "`loopwire serve mcp " in table


def test_the_layout_lists_every_example() -> None:
    layout = README[README.index("## Repository layout") :]
    line = next(x for x in layout.splitlines() if x.startswith("examples/"))
    listed = set(re.findall(r"[\w-]+\.py", line))
    assert listed == {p.name for p in (ROOT / "examples").glob("*.py")}, line


def test_the_shell_examples_write_no_file_into_the_checkout() -> None:
    # A file a reader's shell writes from a README example lands in the repository they run it from:
    # only temporary files (a variable set from mktemp) or /dev/null.
    for block in _blocks("bash"):
        for line in block.splitlines():
            command = line.split("  #")[0]
            for target in re.findall(r"(?<![0-9&>])>>?\s*([^\s&|;]+)", command):
                assert target.startswith(('"$', "$", "/dev/")), line
