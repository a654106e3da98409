"""MkDocs hooks (mkdocs.yml `hooks:`): the site's two generated parts.

- The front page is README.md itself, served as index.md (no copy of it under docs/): its links to
  `docs/<page>.md`, written so that they work on GitHub, become `<page>.md` inside the site.
- The configuration reference on configuration.md is generated from config/schema.yaml at build time,
  between the page's markers, so it cannot drift from the schema: every key (nested objects, the items
  of arrays, each branch of a oneOf, the entries of a map such as configurations.<name>) with its path,
  type, default, allowed values and description.

The generator (schema_rows, schema_reference) works on any JSON schema given as a dict, so that
tests/test_docs.py can show it on small schemas of its own.
"""

from __future__ import annotations

import html
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SCHEMA = ROOT / "config" / "schema.yaml"
CONFIG_PAGE = "configuration.md"
BEGIN = "<!-- longctx:schema-reference:begin -->"
END = "<!-- longctx:schema-reference:end -->"

# A map's entries (additionalProperties) are written <name>; an array's items [].
ENTRY = "<name>"
ITEM = "[]"

log = logging.getLogger("mkdocs.hooks.longctx")


class SchemaDocError(ValueError):
    """The schema cannot be documented as asked (a key without a description, an unresolvable $ref)."""


@dataclass(frozen=True)
class Row:
    path: str
    type: str
    default: str
    allowed: str
    description: str
    required: bool


# ---------------------------------------------------------------------------------------------------
# The generator


def _resolve(node: dict, root: dict) -> dict:
    """A node with its $ref (local, "#/...") followed; the node's own keys win over the target's."""
    seen = set()
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/") or ref in seen:
            raise SchemaDocError(f"cannot follow $ref {ref!r} (only local, acyclic refs)")
        seen.add(ref)
        target: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaDocError(f"$ref {ref!r} points at nothing")
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _branches(node: dict, root: dict) -> list[dict]:
    out = []
    for key in ("oneOf", "anyOf", "allOf"):
        for branch in node.get(key) or []:
            out.append(_resolve(branch, root))
    return out


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _type_of(node: dict, root: dict) -> str:
    """The node's type in words: "integer or null", "array of integer", "array of integer, or object"."""
    branches = _branches(node, root)
    if "type" not in node and "enum" not in node and branches:
        return ", or ".join(_type_of(b, root) for b in branches)
    types = node.get("type")
    if types is None and "enum" in node:
        names = {"null" if v is None else "boolean" if isinstance(v, bool) else
                 "integer" if isinstance(v, int) else "number" if isinstance(v, float) else
                 "string" if isinstance(v, str) else type(v).__name__ for v in node["enum"]}
        types = sorted(names, key=lambda t: (t == "null", t))
    if types is None:
        if "properties" in node or isinstance(node.get("additionalProperties"), dict):
            types = ["object"]
        elif "items" in node:
            types = ["array"]
        else:
            return "any"
    if isinstance(types, str):
        types = [types]
    words = []
    for t in types:
        if t == "array" and isinstance(node.get("items"), dict):
            words.append(f"array of {_type_of(_resolve(node['items'], root), root)}")
        elif t == "object" and isinstance(node.get("additionalProperties"), dict) and "properties" not in node:
            words.append(f"map of {ENTRY} to {_type_of(_resolve(node['additionalProperties'], root), root)}")
        else:
            words.append(t)
    return " or ".join(words)


def _constraints(node: dict, root: dict) -> list[str]:
    out = []
    if "enum" in node:
        out.append("one of " + ", ".join(f"`{_json(v)}`" if not isinstance(v, str) else f"`{v}`" for v in node["enum"]))
    if "const" in node:
        out.append(f"exactly `{_json(node['const'])}`")
    for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in node and not isinstance(node[key], bool):
            out.append(f"{sign} {_json(node[key])}")
    if "pattern" in node:
        out.append(f"matches `{node['pattern']}`")
    if "minLength" in node or "maxLength" in node:
        out.append(f"length {node.get('minLength', 0)} to {node.get('maxLength', 'any')}")
    lo, hi = node.get("minItems"), node.get("maxItems")
    if lo is not None and hi is not None:
        out.append(f"exactly {lo} items" if lo == hi else f"{lo} to {hi} items")
    elif lo is not None:
        out.append(f"at least {lo} item{'s' if lo != 1 else ''}")
    elif hi is not None:
        out.append(f"at most {hi} items")
    if "minProperties" in node:
        out.append(f"at least {node['minProperties']} entr{'ies' if node['minProperties'] != 1 else 'y'}")
    names = node.get("propertyNames")
    if isinstance(names, dict) and "pattern" in names:
        out.append(f"names match `{names['pattern']}`")
    items = node.get("items")
    if isinstance(items, dict):
        items = _resolve(items, root)
        if "properties" not in items:
            inner = _constraints(items, root)
            if inner:
                out.append("each item " + ", ".join(inner))
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and "properties" not in node:
        extra = _resolve(extra, root)
        if "properties" not in extra:
            inner = _constraints(extra, root)
            if inner:
                out.append("each value " + ", ".join(inner))
    if node.get("additionalProperties") is False and node.get("properties"):
        out.append("no other keys")
    if "type" not in node and "enum" not in node:
        for branch in _branches(node, root):
            inner = _constraints(branch, root)
            if inner:
                out.append(f"as {_type_of(branch, root)}: " + ", ".join(inner))
    return out


def schema_rows(schema: dict) -> list[Row]:
    """Every key of the schema, depth first in the schema's order, each with its path.

    Paths: `a.b` for a property, `a.<name>` for a map's entries (additionalProperties), `a[]` for the
    items of an array whose items are objects, and a oneOf/anyOf/allOf branch's keys under the key
    itself (lengths.adaptive.min).
    """
    rows: list[Row] = []

    def walk(node: dict, path: str, required: bool) -> None:
        node = _resolve(node, schema)
        if path:
            default = _json(node["default"]) if "default" in node else ""
            rows.append(Row(path=path, type=_type_of(node, schema), default=default,
                            allowed="; ".join(_constraints(node, schema)),
                            description=" ".join(str(node.get("description", "")).split()), required=required))
        children(node, path)
        for branch in _branches(node, schema):
            children(branch, path)

    def children(node: dict, path: str) -> None:
        needed = set(node.get("required") or [])
        prefix = f"{path}." if path else ""
        for name, child in (node.get("properties") or {}).items():
            walk(child, prefix + name, name in needed)
        # A map's entries and an array's items get rows of their own where they have keys of their own
        # (configurations.<name>), and a map's entries where the map has named keys too; a map or an array
        # of plain values is described by its own row (env: "map of <name> to string").
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            extra = _resolve(extra, schema)
            if _has_keys(extra) or "properties" in node:
                walk(extra, prefix + ENTRY, False)
        items = node.get("items")
        if isinstance(items, dict):
            items = _resolve(items, schema)
            if _has_keys(items):
                walk(items, path + ITEM, False)

    def _has_keys(node: dict) -> bool:
        if node.get("properties") or any(b.get("properties") for b in _branches(node, schema)):
            return True
        extra, items = node.get("additionalProperties"), node.get("items")
        return (isinstance(extra, dict) and _has_keys(_resolve(extra, schema))) or \
            (isinstance(items, dict) and _has_keys(_resolve(items, schema)))

    walk(schema, "", False)
    return rows


def undocumented(schema: dict) -> list[str]:
    """The paths of the keys that have no description."""
    return [row.path for row in schema_rows(schema) if not row.description]


_CODE = re.compile(r"`([^`]+)`")


def _cell(text: str) -> str:
    """Text as HTML: escaped, `code` spans as <code>."""
    parts = _CODE.split(text)
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def _anchor(path: str) -> str:
    return "key-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", path).strip("-")


def schema_reference(schema: dict, *, require_descriptions: bool = False, heading: str = "###") -> str:
    """The reference as Markdown: the schema's own description, then one heading and one table per
    top-level key (the table is HTML, so that no description needs Markdown escaping).

    With require_descriptions, a key without a description is an error naming every such key."""
    rows = schema_rows(schema)
    if require_descriptions:
        missing = [row.path for row in rows if not row.description]
        if missing:
            raise SchemaDocError("keys without a description: " + ", ".join(missing))
    out = []
    if schema.get("description"):
        out.append(f"<p>{_cell(' '.join(str(schema['description']).split()))}</p>\n")
    groups: dict[str, list[Row]] = {}
    for row in rows:
        top = re.split(r"[.\[]", row.path, maxsplit=1)[0]
        groups.setdefault(top, []).append(row)
    for top, group in groups.items():
        out.append(f"{heading} {top}\n")
        out.append("<table class=\"schema-keys\">")
        out.append("<thead><tr><th>key</th><th>type</th><th>default</th><th>allowed</th><th>description</th></tr></thead>")
        out.append("<tbody>")
        for row in group:
            default = f"<code>{html.escape(row.default)}</code>" if row.default else ("required" if row.required else "")
            out.append(
                f"<tr id=\"{_anchor(row.path)}\"><td><code>{html.escape(row.path)}</code></td>"
                f"<td>{html.escape(row.type)}</td><td>{default}</td><td>{_cell(row.allowed)}</td>"
                f"<td>{_cell(row.description)}</td></tr>")
        out.append("</tbody></table>\n")
    return "\n".join(out)


def fill_reference(markdown: str, reference: str) -> str:
    """The page with the text between its markers replaced by the reference (the markers stay)."""
    start, end = markdown.find(BEGIN), markdown.find(END)
    if start < 0 or end < start:
        raise SchemaDocError(f"{CONFIG_PAGE} has no {BEGIN} ... {END} block for the generated reference")
    return markdown[:start] + BEGIN + "\n\n" + reference + "\n" + markdown[end:]


_DOCS_LINK = re.compile(r"(\]\(\s*<?|^\[[^\]]+\]:\s*<?)(?:\./)?docs/", re.MULTILINE)


def readme_for_site(text: str) -> str:
    """README.md as the site's index page: links to docs/<page> become <page>."""
    return _DOCS_LINK.sub(r"\1", text)


def load_schema(path: Path = SCHEMA) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


# ---------------------------------------------------------------------------------------------------
# The hooks


def on_files(files, config):
    from mkdocs.structure.files import File

    if files.get_file_from_path("index.md") is not None:
        from mkdocs.exceptions import PluginError

        raise PluginError("docs/index.md exists: the site's front page is README.md (docs/hooks.py)")
    files.append(File.generated(config, "index.md", content=readme_for_site(README.read_text())))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != CONFIG_PAGE:
        return markdown
    from mkdocs.exceptions import PluginError

    try:
        schema = load_schema()
        page = fill_reference(markdown, schema_reference(schema, require_descriptions=True))
    except SchemaDocError as e:
        raise PluginError(str(e)) from e
    rows, bare = schema_rows(schema), undocumented(schema)
    log.info("configuration reference: %d keys of %s, %d without a description", len(rows), SCHEMA.name, len(bare))
    return page


def on_serve(server, config, builder):
    server.watch(str(README))
    server.watch(str(SCHEMA))
    return server
