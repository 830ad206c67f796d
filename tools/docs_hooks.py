"""MkDocs hooks (mkdocs.yml): the parts of the docs site that are generated, so that they cannot
drift from the code. Every strategy page ends with what the registry says of it and with every
key of its config file (default and meaning, from the YAML's own comments); the strategies'
index is the registry's table; the configuration page ends with a reference of every config
group, option and key, read from conf/."""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
GROUPS = ("model", "task", "engine", "hardware", "tracking")  # strategies have pages of their own
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")


# A config file's command line: `# evora <args>   (what it is)`
COMMAND_LINE = re.compile(r"#\s*(?P<command>evora [^ ]+(?: [^ (]+)*)\s*(\((?P<what>.*)\))?\s*$")


def header(path: Path) -> str:
    """A config file's first comment line, less its `# evora group=option` command."""
    first = path.read_text().splitlines()[0]
    command = COMMAND_LINE.match(first)
    if command is None:
        return first.lstrip("# ").strip()
    return (command.group("what") or "").strip()


def prose(text: str) -> str:
    """A config comment as Markdown text: its `<`, `*`, `_` and the like are shown, not read as markup."""
    return re.sub(r"([\\`*_\[\]])", r"\\\1", html.escape(text, quote=False))


def documented_keys(path: Path) -> list[tuple[str, str, str]]:
    """(dotted key, default, meaning) for every key of a config file, outside its defaults list.
    A commented section whose keys have no comments of their own is a value (`families: {addition:
    1}`): one row, its comment the meaning. Hydra's own settings (`hydra:`) keep their prefix."""
    lines = parsed_keys(path)
    values = [key for key, value, meaning in lines if value is None and meaning and not any(
        m for k, _, m in lines if k.startswith(key + "."))]  # fmt: skip

    def inside(key: str) -> bool:
        return any(key.startswith(v + ".") for v in values)

    loaded = yaml.safe_load(path.read_text()) if values else {}
    rows = []
    for key, value, meaning in lines:
        if key in values and not inside(key):
            node = functools.reduce(lambda tree, part: tree[part], key.split("."), loaded)
            rows.append((key, yaml.safe_dump(node, default_flow_style=True, width=10**6).strip(), meaning))
        elif value is not None and not inside(key):
            rows.append((key, value, meaning))
    return rows


def parsed_keys(path: Path) -> list[tuple[str, str | None, str]]:
    """(dotted key, value or None for a section, comment) of every key line, in file order."""
    keys: list[tuple[str, str | None, str]] = []
    parents: list[str] = []
    in_defaults = False
    for line in path.read_text().splitlines():
        found = KEY_LINE.match(line)
        if found is None or line.lstrip().startswith(("#", "- ")):
            continue
        depth = len(found.group("indent")) // 2
        parents = parents[:depth]
        key, value = found.group("key"), found.group("value").strip()
        in_defaults = key == "defaults" if depth == 0 else in_defaults
        if in_defaults:
            continue
        keys.append((".".join([*parents, key]), value or None, (found.group("comment") or "").strip()))
        if value == "":
            parents.append(key)  # a section: its keys follow, indented
    return keys


def cell(text: str) -> str:
    """Text in a table cell: its bars ("zscore | centered_rank") are text, not the cell's end."""
    return text.replace("|", "\\|")


def meaning_cell(comment: str) -> str:
    """A key's comment as a table cell: its text as written (`runs/<date>_<time>` is no HTML tag and
    no emphasis), its backticked spans as code."""
    parts = re.split(r"(`[^`]*`)", comment)
    return cell("".join(part if part.startswith("`") else prose(part) for part in parts))


def key_table(path: Path, prefix: str = "") -> str:
    rows = [
        f"| `{prefix}{key}` | `{cell(value)}` | {meaning_cell(meaning)} |"
        for key, value, meaning in documented_keys(path)
    ]
    return "\n".join(["| key | default | meaning |", "| --- | --- | --- |", *rows]) if rows else "(no keys of its own)"


def strategy_section(name: str) -> str:
    from evora.strategies import get_strategy

    entry = get_strategy(name)
    path = CONF / "strategy" / f"{name}.yaml"
    what = f" ({header(path)})" if header(path) else ""
    runs = f" (it runs the whole job itself: `{entry.runner}`)" if entry.runner else ""
    facts = [
        f"- **Selected by** `strategy={name}`{what}",
        f"- **What it is** {entry.summary}",
        f"- **Kind** `{entry.kind.name}`: {entry.kind.meaning}{runs}",
    ]
    if entry.center:
        facts.append(f"- **Final adapter** `adapters/{entry.center}`")
    return "\n".join(
        [
            "",
            "## At a glance (from the registry)",
            "",
            *facts,
            "",
            f"## Settings (`conf/strategy/{name}.yaml`)",
            "",
            key_table(path, "strategy."),
            "",
        ]
    )


def strategies_table() -> str:
    from evora.strategies import entries
    from evora.strategies.kinds import KINDS

    rows = [
        f"| [`{e.name}`]({e.name}.md) | {e.summary} | `{e.kind.name}` |"
        for e in sorted(entries(), key=lambda e: e.name)
    ]
    kinds = [f"- `{kind.name}`: {kind.meaning}" for kind in KINDS]
    return "\n".join(
        ["", "| strategy | what it is | kind |", "| --- | --- | --- |", *rows, "", "Kinds:", "", *kinds, ""]
    )


def configuration_reference() -> str:
    parts = ["", "## Reference (generated from `conf/`)", ""]
    parts += ["Top level (`conf/config.yaml`):", "", key_table(CONF / "config.yaml"), ""]
    for group in GROUPS:
        parts += [f"### `{group}=`", ""]
        for path in sorted((CONF / group).glob("*.yaml")):
            if path.stem == "schema":
                continue
            parts += [f"#### `{group}={path.stem}`", "", header(path), "", key_table(path, f"{group}."), ""]
    parts += ["Strategies: each has a page with its keys ([Strategies](strategies/index.md)).", ""]
    return "\n".join(parts + experiments_reference())


def experiments_reference() -> list[str]:
    """Every named experiment (`conf/experiment/`), grouped by folder (the page's contents list the
    folders, not every experiment): its command, what it is and the values it sets."""
    parts = ["### `+experiment=`", ""]
    paths = sorted((CONF / "experiment").rglob("*.yaml"))
    for folder in sorted({path.parent for path in paths}):
        name = folder.relative_to(CONF / "experiment").as_posix()
        parts += [f"#### {'`' + name + '/`' if name != '.' else 'Top level'}", ""]
        for path in (p for p in paths if p.parent == folder):
            parts += experiment_entry(path)
    return parts


def experiment_entry(path: Path) -> list[str]:
    """Its command as a command, what it is as a paragraph, the values it sets as a table."""
    name = path.relative_to(CONF / "experiment").with_suffix("").as_posix()
    comments = [line for line in path.read_text().splitlines()[1:] if line.startswith("#")]
    found = COMMAND_LINE.match(comments[0]) if comments else None
    command = [] if found is None else ["```bash", found.group("command"), "```", ""]
    what = ([found.group("what") or ""] if found else []) + [c[1:].strip() for c in comments[1 if found else 0 :]]
    return [f"##### `+experiment={name}`", "", *command, prose(" ".join(w for w in what if w)), "", key_table(path), ""]


TABLE_CELL = re.compile(r"<t[dh]>.*?</t[dh]>", re.DOTALL)
CELL_CODE = re.compile(r"<code>([^<]*)</code>")


def breakable(code: re.Match[str]) -> str:
    """Code in a table cell may wrap after its dots, slashes, underscores, commas and colons
    (`strategy.<wbr>population`), never mid-word (as "strategy.populat ion")."""
    return "<code>" + re.sub(r"([./_,:])(?=[^<])", r"\1<wbr>", code.group(1)) + "</code>"


def on_page_content(html_text: str, page: Any, config: Any, files: Any) -> str:
    return TABLE_CELL.sub(lambda cell: CELL_CODE.sub(breakable, cell.group(0)), html_text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    source = page.file.src_uri
    if source == "strategies/index.md":
        return markdown + strategies_table()
    if source.startswith("strategies/"):
        return markdown + strategy_section(Path(source).stem)
    if source == "configuration.md":
        return markdown + configuration_reference()
    return markdown
