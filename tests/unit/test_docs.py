"""The docs site (mkdocs.yml, docs/, tools/docs_hooks.py): every registered strategy has a page
in the nav, every key of every strategy's config is in its config file with a meaning (the page's
settings table is read from there). The site's strict build, and the pages as they render, are
tests/integration/test_docs_site.py's."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import yaml

from evora.strategies import entries as registered

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from docs_hooks import CONF, documented_keys  # noqa: E402


def entries():
    """evora's own strategies: another test of this process may have registered a plugin's
    (test_documented_commands composes `strategy.name=mypkg.strategies:...`)."""
    return [e for e in registered() if e.config.__module__.startswith("evora.")]


def nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    return [page for item in node for page in nav_pages(item)]


def test_every_strategy_has_a_page_in_the_nav():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # its !!python tags unread
    pages = set(nav_pages(config["nav"]))
    assert {f"strategies/{e.name}.md" for e in entries()} <= pages
    assert all((ROOT / "docs" / page).is_file() for page in pages)


def test_every_strategy_key_is_documented_in_its_config_file():
    for entry in entries():
        documented = {key: meaning for key, _, meaning in documented_keys(CONF / "strategy" / f"{entry.name}.yaml")}
        fields = {field.name for field in dataclasses.fields(entry.config)}
        assert fields == {key.split(".")[0] for key in documented}, entry.name
        assert all(documented.values()), f"{entry.name}: keys without a meaning"


def test_the_configuration_pages_table_lists_every_option_of_every_group():
    """Each group's files in conf/ (not group_options, which adds strategies registered in this
    process: another test's plugin)."""
    from evora.plan.compose import GROUPS

    rows = {}
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) == 3:
            rows[cells[0].strip("| `")] = set(re.findall(r"`([\w.]+)`", cells[1]))
    assert set(rows) == set(GROUPS)
    for group in GROUPS:
        assert rows[group] == {p.stem for p in (CONF / group).glob("*.yaml")} - {"schema"}, group


def readme_strategies() -> set[str]:
    """The strategies the README's table names (its first column's backticked names)."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Strategies") :].split("\n\n")[1]
    return {name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split(" | ")[0])}


def test_the_readmes_strategy_table_lists_every_registered_strategy():
    assert readme_strategies() == {e.name for e in entries()}


def test_every_kind_says_what_it_means():
    from evora.strategies.kinds import KINDS

    assert {e.kind for e in entries()} <= set(KINDS)
    assert all(len(kind.meaning.split()) >= 5 for kind in KINDS), [k.name for k in KINDS if not k.meaning]


def test_a_section_of_uncommented_keys_is_documented_as_one_value(tmp_path):
    path = tmp_path / "mix.yaml"
    lines = ["defaults:", "  - x", "name: mix  # the name", "families:  # family -> weight", "  a: 1", "  b: 2"]
    path.write_text("\n".join([*lines, "hydra:", "  job:", "    chdir: false  # keep paths", ""]))
    assert documented_keys(path) == [
        ("name", "mix", "the name"),
        ("families", "{a: 1, b: 2}", "family -> weight"),
        ("hydra.job.chdir", "false", "keep paths"),
    ]


def test_every_key_of_the_configuration_reference_has_a_meaning():
    """The reference's files (the groups', the experiments', config.yaml): each row says what its key is."""
    from docs_hooks import GROUPS

    paths = [CONF / "config.yaml", *(CONF / "experiment").rglob("*.yaml")]
    paths += [p for group in GROUPS for p in (CONF / group).glob("*.yaml") if p.stem != "schema"]
    empty = [f"{p.relative_to(CONF)}: {key}" for p in paths for key, _, meaning in documented_keys(p) if not meaning]
    assert empty == []
