"""docs/interface.md is exact: every command, flag and argument it lists is the CLI's, and the CLI has none it
does not list; every flag the first-agreed command blocks name exists; every config key is on the page."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import typer.main
import yaml

from vastctl.cli.app import app
from vastctl.config import Config

PAGE = Path(__file__).resolve().parent.parent / "docs" / "interface.md"
FLAG = re.compile(r"--[a-z][a-z-]*")
ARGUMENT = re.compile(r"\b[A-Z][A-Z_]+\b")


def section(title: str) -> str:
    text = PAGE.read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def code_blocks(text: str, language: str = "") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def listed(block: str) -> dict[str, tuple[set[str], set[str]]]:
    """`vastctl NAME [SUB] …` lines (continuations indented) → command → (flags, ARGUMENTS)."""
    commands: dict[str, tuple[set[str], set[str]]] = {}
    name = None
    for line in block.splitlines():
        if line.startswith("vastctl"):
            words = line.split()[1:]
            path = []
            for word in words:
                if not re.fullmatch(r"[a-z][a-z-]*", word):
                    break
                path.append(word)
            name = " ".join(path)
            rest = " ".join(words[len(path):])
            commands[name] = (set(), set())
        elif not line.strip() or name is None:
            continue
        else:
            rest = line
        rest = rest.split("#", 1)[0]
        flags, arguments = commands[name]
        flags.update(FLAG.findall(rest))
        # a flag's value (--uuid U, --rate PROOFS_PER_HOUR) is not a positional argument
        arguments.update(ARGUMENT.findall(re.sub(r"--[a-z-]+ [A-Z_|a-z]+", "", rest)))
    return commands


def cli_commands() -> dict[str, tuple[set[str], set[str]]]:
    found: dict[str, tuple[set[str], set[str]]] = {}

    def walk(command: click.Command, path: list[str]) -> None:
        flags = {o for p in command.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}
        arguments = {p.name.upper() for p in command.params if isinstance(p, click.Argument)}
        if isinstance(command, click.Group):
            if not path:
                found[""] = (flags - {"--help"}, arguments)
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
        else:
            found[" ".join(path)] = (flags - {"--help"}, arguments)

    walk(typer.main.get_command(app), [])
    return found


def test_every_command_and_flag_on_the_page_is_the_clis_and_the_cli_has_no_other():
    (block,) = code_blocks(section("Every command and flag"))
    page, cli = listed(block), cli_commands()
    assert sorted(page) == sorted(cli)
    for name in cli:
        assert page[name][0] == cli[name][0], name
        assert page[name][1] == cli[name][1], name


def test_the_first_agreed_command_blocks_name_only_flags_the_cli_has():
    cli = cli_commands()
    for title in ("Instance commands (boot scripts)", "Operator commands"):
        for block in code_blocks(section(title)):
            for line in block.splitlines():
                words = line.split()
                if len(words) < 2 or words[0] != "vastctl" or not words[1][0].isalpha():
                    continue
                flags = set(FLAG.findall(line.split("#", 1)[0]))
                if words[1] == "--version":
                    continue
                theirs = set().union(*(f for name, (f, _) in cli.items() if name and name.split()[0] == words[1]))
                assert flags <= theirs, (line, flags - theirs)


def config_keys(cls=Config, prefix: str = "") -> set[str]:
    keys = set()
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            keys |= config_keys(type(default), f"{prefix}{f.name}.")
        else:
            keys.add(prefix + f.name)
    return keys


def test_every_config_key_is_on_the_page():
    (example,) = code_blocks(section("Config file (YAML)"), "yaml")
    on_page = set()
    for top, value in yaml.safe_load(example).items():
        on_page |= {f"{top}.{key}" for key in value} if isinstance(value, dict) else {top}
    on_page |= set(re.findall(r"`([a-z_]+\.[a-z_]+)`", PAGE.read_text()))
    assert config_keys() - on_page == set()


def test_the_readme_points_at_the_interface_page():
    readme = (PAGE.parent.parent / "README.md").read_text()
    assert "docs/interface.md" in readme and "CONTRACT.md" not in readme
