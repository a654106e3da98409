"""The documentation site (mkdocs.yml, docs/): it builds with --strict and loads nothing from the network,
the README is its front page (and opens with the two commands), and the configuration reference is
generated from config/schema.yaml with every key and every description.

The schema is walked here independently of docs/hooks.py's generator, and the checks are shown to fail
on a page that lacks a key and on a schema key without a description.
"""

from __future__ import annotations

import html
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SCHEMA = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
COMMANDS = [
    "make report   # sets up .venv and TeX, measures the embedded reference engine, writes report/longctx.pdf and report/longctx.md",
    "make test     # sets up .venv and TeX, runs the tests",
]


def _hooks():
    spec = importlib.util.spec_from_file_location("longctx_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as mkdocs loads a hook (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


# --- an independent walk of a schema: every key's path, and the node it names --------------------------


def _deref(node: dict, root: dict) -> dict:
    while "$ref" in node:
        target = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def schema_keys(node: dict, root: dict, path: str = "") -> dict[str, dict]:
    """path -> node: properties as a.b, a map's entries (additionalProperties with keys) as a.<name>, an
    array's object items as a[], a oneOf/anyOf/allOf branch's keys under the key itself."""
    node = _deref(node, root)
    out: dict[str, dict] = {}
    for branch in node.get("oneOf", []) + node.get("anyOf", []) + node.get("allOf", []):
        out.update(schema_keys(branch, root, path))
    for name, child in node.get("properties", {}).items():
        p = f"{path}.{name}" if path else name
        out[p] = _deref(child, root)
        out.update(schema_keys(child, root, p))
    for key, suffix in (("additionalProperties", ".<name>"), ("items", "[]")):
        sub = node.get(key)
        if isinstance(sub, dict) and _deref(sub, root).get("properties"):
            out[path + suffix] = _deref(sub, root)
            out.update(schema_keys(sub, root, path + suffix))
    return out


def descriptions(node) -> list[str]:
    """Every description string anywhere in the schema."""
    if isinstance(node, dict):
        own = [node["description"]] if isinstance(node.get("description"), str) else []
        return own + [d for v in node.values() for d in descriptions(v)]
    if isinstance(node, list):
        return [d for v in node for d in descriptions(v)]
    return []


def _text(fragment: str) -> str:
    """HTML as the reader sees it: tags dropped, entities decoded, whitespace normalised."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def _norm(description: str) -> str:
    return " ".join(description.replace("`", "").split())


ROW = re.compile(r"<tr id=\"[^\"]*\"><td><code>(.*?)</code></td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td></tr>")


def table_rows(page: str) -> dict[str, dict[str, str]]:
    """The reference's rows: path -> its cells as text."""
    return {html.unescape(m[1]): {"type": _text(m[2]), "default": _text(m[3]), "allowed": _text(m[4]),
                                  "description": _text(m[5])} for m in ROW.finditer(page)}


def check_page(schema: dict, page: str) -> list[str]:
    """What the page gets wrong about the schema: keys absent, and keys whose description, default or
    allowed values are not in their row."""
    rows = table_rows(page)
    problems = []
    for path, node in schema_keys(schema, schema).items():
        row = rows.get(path)
        if row is None:
            problems.append(f"{path}: absent")
            continue
        if isinstance(node.get("description"), str) and row["description"] != _norm(node["description"]):
            problems.append(f"{path}: description {row['description']!r}")
        if "default" in node and row["default"] != hooks._json(node["default"]):
            problems.append(f"{path}: default {row['default']!r}")
        for value in node.get("enum", []):
            if (value if isinstance(value, str) else hooks._json(value)) not in row["allowed"]:
                problems.append(f"{path}: enum value {value!r} not in {row['allowed']!r}")
    return problems


# --- the site -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out),
                          "--config-file", str(ROOT / "mkdocs.yml")], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def test_site_builds_strictly_with_the_readme_as_its_front_page(site):
    index = (site / "index.html").read_text()
    assert html.unescape(COMMANDS[0]) in html.unescape(index)
    # the README's docs/<page>.md links point at the site's pages
    assert 'href="deployment.html"' in index and 'href="configuration.html"' in index
    assert "docs/deployment.md" not in index
    assert not (ROOT / "docs" / "index.md").exists() and not (site / "hooks.py").exists()


def test_site_loads_nothing_from_the_network(site):
    remote = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.IGNORECASE)
    for page in site.rglob("*.html"):
        assert not remote.search(page.read_text()), page


def test_configuration_page_has_every_key_with_its_description(site):
    page = (site / "configuration.html").read_text()
    keys = schema_keys(SCHEMA, SCHEMA)
    assert len(keys) > 150 and "lengths.adaptive.budget_s" in keys and "configurations.<name>.hardware.gpu" in keys
    assert check_page(SCHEMA, page) == []
    text = _text(page)
    for description in descriptions(SCHEMA):
        assert _norm(description) in text, description
    # the hand-written prose stays on the page beside the generated table
    assert "config/longctx.yaml is the default" in text


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    first_block = lines[lines.index("```sh") + 1:lines.index("```")]
    assert first_block == COMMANDS
    assert all(not line.strip() or line.startswith("#") for line in lines[:lines.index("```sh")])


def test_readme_links_point_at_files_that_exist():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    relative = [link for link in links if not re.match(r"[a-z]+:|#", link)]
    assert len(relative) >= 10
    for link in relative:
        assert (ROOT / link.split("#")[0]).is_file(), link
    assert hooks.readme_for_site("[a](docs/x.md#y) [b](https://h/docs/x.md)\n[c]: docs/z.md") == \
        "[a](x.md#y) [b](https://h/docs/x.md)\n[c]: z.md"


# --- the generator and the checks, on small schemas -------------------------------------------------------

SMALL = {
    "description": "a small schema",
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number", "description": "x coordinate"}}}},
    "type": "object",
    "required": ["a"],
    "properties": {
        "a": {"description": "a list, or auto", "oneOf": [
            {"type": "array", "items": {"type": "integer", "minimum": 1}},
            {"type": "object", "properties": {"auto": {"type": "object", "description": "automatic", "properties": {
                "lo": {"type": "integer", "minimum": 1, "default": 2, "description": "the low end"}}}}}]},
        "b": {"type": "object", "description": "group b", "properties": {
            "c": {"enum": ["x", "y", None], "default": "x", "description": "a choice <with> `code`"}}},
        "pts": {"type": "array", "description": "points", "items": {"$ref": "#/$defs/point"}},
        "m": {"type": "object", "description": "named entries", "additionalProperties": {
            "type": "object", "properties": {"k": {"type": "boolean", "default": False, "description": "a flag"}}}},
    },
}


def test_generator_walks_nested_objects_branches_items_maps_and_refs():
    reference = hooks.schema_reference(SMALL)
    rows = table_rows(reference)
    assert set(rows) == {"a", "a.auto", "a.auto.lo", "b", "b.c", "pts", "pts[]", "pts[].x", "m", "m.<name>", "m.<name>.k"}
    assert rows["a"]["default"] == "required" and rows["a"]["type"] == "array of integer, or object"
    assert rows["a.auto.lo"] == {"type": "integer", "default": "2", "allowed": ">= 1", "description": "the low end"}
    assert rows["b.c"]["type"] == "string or null" and rows["b.c"]["allowed"] == "one of x, y, null"
    assert rows["b.c"]["description"] == "a choice <with> code" and "<code>code</code>" in reference
    assert rows["pts[].x"]["description"] == "x coordinate" and rows["m.<name>.k"]["default"] == "false"
    assert check_page(SMALL, reference) == []


def test_a_key_missing_from_the_page_or_wrong_in_it_is_caught():
    reference = hooks.schema_reference(SMALL)
    without = re.sub(r"<tr id=\"key-b.c\">.*?</tr>", "", reference)
    assert check_page(SMALL, without) == ["b.c: absent"]
    wrong = reference.replace("the low end", "the high end")
    assert check_page(SMALL, wrong) == ["a.auto.lo: description 'the high end'"]


def test_a_key_without_a_description_is_caught():
    schema = {"type": "object", "properties": {"a": {"type": "object", "description": "A", "properties": {
        "b": {"type": "integer", "description": "B"}, "c": {"type": "string"}}}}}
    assert hooks.undocumented(schema) == ["a.c"]
    with pytest.raises(hooks.SchemaDocError, match=r"without a description: a\.c$"):
        hooks.schema_reference(schema, require_descriptions=True)
    schema["properties"]["a"]["properties"]["c"]["description"] = "C"
    assert "C" in hooks.schema_reference(schema, require_descriptions=True)


def test_the_configuration_page_keeps_its_markers():
    with pytest.raises(hooks.SchemaDocError, match="no .* block"):
        hooks.fill_reference("# Configuration\n\nprose only\n", "table")
    page = (ROOT / "docs" / "configuration.md").read_text()
    filled = hooks.fill_reference(page, "THE TABLE")
    assert "THE TABLE" in filled and "outside the\nsite" not in filled and filled.startswith("# Configuration")


def test_no_word_of_a_retired_interval_method_stays():
    """Issue 46, item 9: speedups' and savings' intervals are Welch's on the logs, the load latencies' order
    statistics', the fits' and their bands' bootstrap. The words that said bootstrap where the interval is another's
    are gone, and the reports' legends name each interval as what it is."""
    retired = {"longctx/report/summary.py": "bootstrap interval of its speedup",
               "longctx/analysis/__init__.py": "with bootstrap intervals and verdicts",
               "longctx/report/figures/load.py": "bootstrap intervals as bars",
               "templates/sections/diagnosis.tex.j2": r"\% bootstrap percentile intervals)",
               "templates/markdown/summary.md.j2": "% bootstrap percentile intervals.)"}
    for path, words in retired.items():
        assert words not in (ROOT / path).read_text(), (path, words)
    for path in ("templates/sections/diagnosis.tex.j2", "templates/markdown/summary.md.j2"):
        assert "a speedup's Welch interval on the logs" in (ROOT / path).read_text(), path
    for path in ("templates/sections/prefix.tex.j2", "templates/markdown/prefix.md.j2"):
        assert "a saving's Welch interval on the logs" in (ROOT / path).read_text(), path
    assert "bootstrap" in (ROOT / "longctx/analysis/bands.py").read_text()  # the fits' bands are what the legend says
