"""What the grammar backend can enforce of a JSON schema, checked before a request is queued.

xgrammar (0.2.8 / 0.2.9) compiles a schema into a grammar but drops some keywords: a few with a
native warning on stderr (`allOf` with several branches, `pattern` beside `minLength` /
`maxLength`), others silently (`not`, `if`/`then`/`else`, `uniqueItems`, `contains`, ...); and
it treats `oneOf` as `anyOf`. Output that ignores them need not validate. `check_schema` walks
the schema and either makes it enforceable or refuses it with `SchemaNotEnforceable` naming the
keyword and where it is (a JSON pointer):

- `allOf` with several branches is merged into one schema when the branches do not overlap
  (distinct keywords; `properties` with distinct names; `required` unioned; equal `type`s) and
  no `additionalProperties` / `items` would change meaning by the merge; otherwise refused;
- `oneOf` is kept when its branches are exclusive by construction (distinct `type`s, or one
  property whose `const` / single `enum` differs in every branch: a tagged union); otherwise
  refused (xgrammar could emit a value matching two branches);
- `pattern` with `minLength` / `maxLength`, and every keyword in `UNENFORCED`, is refused;
- `$ref` must point into the document (`#...`).

`apply_caps` (opt-in, `StructuredOutput.json_schema(max_string_length=, max_integer_digits=)`)
bounds what a schema leaves unbounded, so `max_tokens` is not the only stop: a string without
`maxLength` / `pattern` / `enum` / `const` / `format` gets `maxLength`, an integer or number
without a bound gets `minimum` / `maximum` of +-(10**digits - 1). Output under a cap still
validates against the original schema.
"""

from __future__ import annotations

import copy
from typing import Any

# Keywords that constrain a value but that the grammar does not enforce.
UNENFORCED = ("not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains",
              "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties",
              "unevaluatedItems", "$dynamicRef", "$recursiveRef", "propertyNames", "patternProperties")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SUBSCHEMA_ONE = ("items", "additionalProperties")
_STRUCTURAL = ("properties", "additionalProperties", "items", "prefixItems")   # what allOf merging combines
_LOCAL = ("additionalProperties", "items")   # keywords that read their own schema's properties / prefixItems


class SchemaNotEnforceable(ValueError):
    """A schema keyword the grammar backend cannot enforce."""

    def __init__(self, keyword: str, where: str, why: str):
        super().__init__(f"keyword {keyword!r} at {where or '#'}: {why}")
        self.keyword = keyword


def check_schema(schema: Any) -> Any:
    """An enforceable equivalent of `schema` (a copy; allOf merged), or SchemaNotEnforceable."""
    return _walk(copy.deepcopy(schema), "#")


def _walk(node: Any, where: str) -> Any:
    if isinstance(node, bool) or not isinstance(node, dict):
        return node
    for kw in UNENFORCED:
        if kw in node and not (kw == "uniqueItems" and node[kw] is False):
            raise SchemaNotEnforceable(kw, where, "the grammar backend does not enforce it")
    ref = node.get("$ref")
    if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
        raise SchemaNotEnforceable("$ref", where, f"only references into the schema itself (#...) resolve, got {ref!r}")
    if "allOf" in node:
        node = _merge_all_of(node, where)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            node[key] = {k: _walk(v, f"{where}/{key}/{k}") for k, v in node[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            node[key] = [_walk(v, f"{where}/{key}/{i}") for i, v in enumerate(node[key])]
    for key in _SUBSCHEMA_ONE:
        if key in node:
            node[key] = _walk(node[key], f"{where}/{key}")
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        raise SchemaNotEnforceable("pattern", where, "pattern with minLength/maxLength cannot both be enforced; "
                                   "write the length into the pattern (e.g. ^[a-z]{2,8}$)")
    if "oneOf" in node:
        _check_exclusive(node["oneOf"], f"{where}/oneOf")
    return node


def _merge_all_of(node: dict, where: str) -> dict:
    branches = node["allOf"]
    if not isinstance(branches, list) or not branches:
        return node
    merged = {k: v for k, v in node.items() if k != "allOf"}
    sources = [merged] + [b for b in branches if isinstance(b, dict) and b]
    structural = [src for src in sources if any(k in src for k in _STRUCTURAL)]
    if len(structural) > 1 and any(k in src for src in structural for k in _LOCAL):
        # additionalProperties / items see only their own schema's properties / prefixItems:
        # beside allOf (or in one branch of several) they mean something a merge would change.
        raise SchemaNotEnforceable("allOf", where, "additionalProperties / items beside the branches' own "
                                   "properties / prefixItems cannot be merged; write the object in one schema")
    for i, branch in enumerate(branches):
        if branch is True or branch == {}:
            continue
        if not isinstance(branch, dict) or "$ref" in branch:
            raise SchemaNotEnforceable("allOf", f"{where}/allOf/{i}", "only inline object branches can be merged")
        for k, v in branch.items():
            if k not in merged:
                merged[k] = copy.deepcopy(v)
            elif k == "required":
                merged[k] = list(dict.fromkeys(list(merged[k]) + list(v)))
            elif k == "properties" and isinstance(v, dict) and isinstance(merged[k], dict):
                for name, sub in v.items():
                    if name in merged[k] and merged[k][name] != sub:
                        raise SchemaNotEnforceable("allOf", f"{where}/allOf/{i}/properties/{name}",
                                                   "branches constrain the same property differently")
                    merged[k][name] = sub
            elif merged[k] != v:
                raise SchemaNotEnforceable("allOf", f"{where}/allOf/{i}/{k}",
                                           f"branches give {k!r} different values; the grammar backend cannot intersect them")
    return merged


def _check_exclusive(branches: Any, where: str) -> None:
    if not isinstance(branches, list) or len(branches) < 2:
        return
    types = [b.get("type") if isinstance(b, dict) else None for b in branches]
    if all(isinstance(t, str) for t in types) and len(set(types)) == len(types) \
            and not {"integer", "number"} <= set(types):
        return
    if all(isinstance(b, dict) and isinstance(b.get("properties"), dict) for b in branches):
        common = set.intersection(*(set(b.get("required", [])) for b in branches))
        for name in common:
            tags = [_tag(b["properties"].get(name)) for b in branches]
            if all(t is not None for t in tags) and len(set(tags)) == len(tags):
                return
    raise SchemaNotEnforceable("oneOf", where, "the grammar enforces 'at least one' (anyOf); give the branches "
                               "distinct types or a required property with a distinct const in each, or use anyOf")


def _tag(prop: Any) -> str | None:
    """A property's single allowed value, as canonical text (None if it allows more than one)."""
    import json
    if not isinstance(prop, dict):
        return None
    if "const" in prop:
        return json.dumps(prop["const"], sort_keys=True)
    if isinstance(prop.get("enum"), list) and len(prop["enum"]) == 1:
        return json.dumps(prop["enum"][0], sort_keys=True)
    return None


def apply_caps(schema: Any, max_string_length: int | None, max_integer_digits: int | None) -> Any:
    """`schema` (already checked) with unbounded strings and numbers bounded (a copy)."""
    if max_string_length is None and max_integer_digits is None:
        return schema
    return _cap(copy.deepcopy(schema), max_string_length, max_integer_digits)


def _cap(node: Any, max_len: int | None, digits: int | None) -> Any:
    if not isinstance(node, dict):
        return node
    types = node.get("type")
    types = [types] if isinstance(types, str) else (types if isinstance(types, list) else [])
    free = not any(k in node for k in ("enum", "const", "$ref"))
    if max_len is not None and "string" in types and free and not any(
            k in node for k in ("maxLength", "pattern", "format")):
        node["maxLength"] = max(max_len, node.get("minLength", 0))
    if digits is not None and free and ("integer" in types or "number" in types):
        bound = 10 ** digits - 1
        if not any(k in node for k in ("maximum", "exclusiveMaximum")):
            node["maximum"] = bound
        if not any(k in node for k in ("minimum", "exclusiveMinimum")):
            node["minimum"] = -bound
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            node[key] = {k: _cap(v, max_len, digits) for k, v in node[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            node[key] = [_cap(v, max_len, digits) for v in node[key]]
    for key in _SUBSCHEMA_ONE:
        if key in node:
            node[key] = _cap(node[key], max_len, digits)
    return node
