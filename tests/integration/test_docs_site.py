"""The docs site as a reader meets it: built with MkDocs, opened from the built folder as files (as
the README says: site/index.html) in headless Chromium (Debian's `chromium`, which `make test`
installs where apt-get runs as root), at 1,280 px. No page shows a Python repr, nothing in the
content column runs past it (a table or a command that must be scrolled sideways hides its end),
every row of the configuration reference has a meaning, and search finds a setting."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 1280
# Chromium as the machine's probe starts it: no sandbox as root, no calls out of a closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPRS = ("<class '", "Kind(name=", "frozenset({'", " object at 0x")  # as repr() writes them

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("docs_site")]

# Whatever in the content column needs sideways scrolling or runs past the column's right edge.
OVERFLOW = """() => {
  const column = document.querySelector('.md-content__inner');
  const right = column.getBoundingClientRect().right + 1;
  const found = [];
  for (const el of column.querySelectorAll('*')) {
    if (el.closest('.headerlink') || el.getClientRects().length === 0) continue;
    // Material's table wrappers reach 0.8rem past the column by design (their padding): their table counts
    const wrapper = el.matches('.md-typeset__scrollwrap, .md-typeset__table');
    const scrolls = el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'visible';
    if (scrolls || (!wrapper && el.getBoundingClientRect().right > right)) {
      found.push(el.tagName.toLowerCase() + ': ' + el.textContent.trim().slice(0, 60));
    }
  }
  if (document.documentElement.scrollWidth > window.innerWidth) found.push('the page scrolls sideways');
  return found;
}"""

# Rows of the tables whose header has a "meaning" column, whose meaning cell is empty.
EMPTY_MEANINGS = """() => {
  const empty = [];
  for (const table of document.querySelectorAll('.md-content table')) {
    const heads = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
    const at = heads.indexOf('meaning');
    if (at < 0) continue;
    for (const row of table.querySelectorAll('tbody tr')) {
      if (row.cells[at].textContent.trim() === '') empty.push(row.cells[0].textContent.trim());
    }
  }
  return empty;
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    built = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, (
        "no chromium on PATH: `make test` installs Debian's (apt-get install chromium) where it runs as root"
    )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def page(browser):
    opened = browser.new_page(viewport={"width": WIDTH, "height": 900})
    yield opened
    opened.close()


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if "assets" not in p.parts and p.name != "404.html")


def test_the_site_builds_strictly_with_its_generated_parts(site):
    """--strict (the fixture's build): a broken link, a page left out of the nav or a bad API
    reference fails it. The generated settings tables and the API's docstrings are there."""
    page = (site / "strategies" / "es.html").read_text()  # file names: the offline plugin's links
    assert "strategy.<wbr>sigma" in page and "noise standard deviation" in page
    assert "evora.api.run" in (site / "api.html").read_text()


def test_no_page_shows_a_python_repr_or_runs_past_its_column(site, page):
    shown, problems = 0, {}
    for path in pages(site):
        page.goto(path.as_uri())
        text = page.inner_text(".md-content")
        found = [f"repr {r!r}" for r in REPRS if r in text] + page.evaluate(OVERFLOW)
        if found:
            problems[path.relative_to(site).as_posix()] = found[:5]
        shown += 1
    assert shown >= 25, f"only {shown} pages built"
    assert not problems, problems


# (key, meaning) of every row of the tables with a "meaning" column, as a reader sees them.
MEANINGS = """() => [...document.querySelectorAll('.md-content table')].flatMap(table => {
  const at = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim()).indexOf('meaning');
  return at < 0 ? [] : [...table.querySelectorAll('tbody tr')].map(row =>
    [row.cells[0].textContent.trim(), row.cells[at].textContent.trim()]);
})"""


def test_every_row_of_the_configuration_reference_has_its_meaning_as_written(site, page):
    page.goto((site / "configuration.html").as_uri())
    assert page.locator("h2#reference-generated-from-conf").count() == 1
    assert page.evaluate(EMPTY_MEANINGS) == []
    # each key's comment as written: `evora resume=runs/<run>` keeps its <run>, `<date>_<time>` no emphasis
    sys.path.insert(0, str(ROOT / "tools"))
    from docs_hooks import CONF, GROUPS, documented_keys

    files = [(CONF / "config.yaml", ""), *((p, "") for p in (CONF / "experiment").rglob("*.yaml"))]
    files += [(p, f"{group}.") for group in GROUPS for p in (CONF / group).glob("*.yaml") if p.stem != "schema"]
    shown = {tuple(row) for row in page.evaluate(MEANINGS)}
    written = {
        (prefix + key, meaning.replace("`", "")) for p, prefix in files for key, _, meaning in documented_keys(p)
    }
    assert written <= shown, sorted(written - shown)[:5]


def test_the_strategies_pages_name_each_kind_in_words(site, page):
    from evora.strategies import entries

    page.goto((site / "strategies" / "es.html").as_uri())
    glance = page.locator("li", has_text="Kind").first.inner_text()
    assert glance.startswith("Kind population: ask/tell"), glance
    page.goto((site / "strategies" / "index.html").as_uri())
    table = page.inner_text(".md-content table >> nth=-1")  # the registry's table, last on the page
    assert all(e.name in table for e in entries() if e.config.__module__.startswith("evora."))


def test_search_works_from_the_built_folder(site, page):
    page.goto((site / "index.html").as_uri())
    page.click(".md-search__input", timeout=10_000)  # shown only where search can run
    page.keyboard.type("noise_reuse")  # a setting's name, as a reader types it
    page.locator(".md-search-result__item").first.wait_for(timeout=20_000)
    links = page.eval_on_selector_all(".md-search-result__link", "links => links.map(a => a.href)")
    assert any(link.split("#")[0].endswith("strategies/es.html") for link in links), links
