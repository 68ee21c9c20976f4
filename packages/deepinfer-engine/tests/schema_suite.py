"""JSON schemas for the enforcement suite (test_schema_enforcement.py): every one is either
enforced (its output validates with `jsonschema`) or refused naming a keyword. All enforced ones
bound their values (lengths, ranges, item counts), so a request must finish before max_tokens."""

NAME = {"type": "string", "minLength": 1, "maxLength": 8}
SMALL = {"type": "integer", "minimum": 0, "maximum": 99}

ENFORCED: list[dict] = [
    # objects
    {"type": "object", "properties": {"id": SMALL, "name": NAME}, "required": ["id", "name"],
     "additionalProperties": False},
    {"type": "object", "properties": {"done": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 5}},
     "required": ["done", "note"], "additionalProperties": False},
    {"type": "object", "properties": {"level": {"enum": ["low", "mid", "high"]}, "score": {"enum": [1, 2.5, None]}},
     "required": ["level", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"version": {"const": "v2"}, "n": {"type": "integer", "minimum": -5, "maximum": 5}},
     "required": ["version", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"a": SMALL, "b": SMALL}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"outer": {"type": "object", "properties": {"inner": {
        "type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"], "additionalProperties": False}},
        "required": ["inner"], "additionalProperties": False}}, "required": ["outer"], "additionalProperties": False},
    # patterns
    {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"],
     "additionalProperties": False},
    {"type": "object", "properties": {"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}, "required": ["hex"],
     "additionalProperties": False},
    {"type": "string", "pattern": "^(yes|no|maybe)$"},
    {"type": "string", "pattern": "^[A-Z][a-z]{1,6}$"},
    # numeric bounds
    {"type": "integer", "minimum": 100, "maximum": 120},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4},
    {"type": "number", "minimum": -1, "maximum": 1},
    {"type": "object", "properties": {"t": {"type": "number", "minimum": 0, "maximum": 40}}, "required": ["t"],
     "additionalProperties": False},
    # arrays
    {"type": "array", "items": SMALL, "minItems": 1, "maxItems": 4},
    {"type": "array", "items": {"enum": ["r", "g", "b"]}, "minItems": 3, "maxItems": 3},
    {"type": "array", "prefixItems": [{"type": "boolean"}, SMALL, NAME], "items": False},
    {"type": "array", "prefixItems": [{"const": "point"}], "items": SMALL, "maxItems": 3},
    {"type": "object", "properties": {"rows": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "items": {"type": "boolean"}, "maxItems": 2}}}, "required": ["rows"], "additionalProperties": False},
    # $ref
    {"$defs": {"tag": {"type": "string", "pattern": "^[a-z]{2,4}$"}}, "type": "array",
     "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 2},
    {"$defs": {"person": {"type": "object", "properties": {"name": NAME, "age": SMALL}, "required": ["name", "age"],
                          "additionalProperties": False}},
     "type": "object", "properties": {"owner": {"$ref": "#/$defs/person"}}, "required": ["owner"],
     "additionalProperties": False},
    {"definitions": {"flag": {"type": "boolean"}}, "type": "object",
     "properties": {"on": {"$ref": "#/definitions/flag"}}, "required": ["on"], "additionalProperties": False},
    # anyOf / oneOf / allOf
    {"anyOf": [SMALL, {"type": "boolean"}, {"type": "null"}]},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "string", "maxLength": 3}, SMALL]}}, "required": ["v"],
     "additionalProperties": False},
    {"oneOf": [{"type": "boolean"}, {"type": "null"}, NAME]},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": SMALL}, "required": ["kind", "r"],
                "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "square"}, "side": SMALL},
                "required": ["kind", "side"], "additionalProperties": False}]},
    {"allOf": [{"type": "object", "properties": {"a": SMALL}, "required": ["a"]},
               {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]}]},
    {"allOf": [{"type": "object", "properties": {"id": SMALL}, "required": ["id"], "additionalProperties": False}]},
    # enums at the top level, strings with length only
    {"enum": ["alpha", "beta", 3, False]},
    {"type": "string", "minLength": 2, "maxLength": 5},
]

# (schema, the keyword the refusal must name)
REFUSED: list[tuple[dict | bool, str]] = [
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "maximum": 3}}},
                {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1}}}]}, "allOf"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf"),
    ({"allOf": [{"type": "object", "properties": {"a": SMALL}}], "properties": {"b": SMALL},
      "additionalProperties": False}, "allOf"),   # additionalProperties does not see the branch's "a"
    ({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4}, "pattern"),
    ({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$", "maxLength": 3}}}, "pattern"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "array", "items": SMALL, "uniqueItems": True, "maxItems": 3}, "uniqueItems"),
    ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "if"),
    ({"type": "array", "contains": {"const": 1}, "maxItems": 3}, "contains"),
    ({"oneOf": [SMALL, {"type": "integer", "minimum": 50, "maximum": 200}]}, "oneOf"),
    ({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}, "$ref"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
    ({"type": "object", "propertyNames": {"pattern": "^x"}}, "propertyNames"),
    (False, "false"),
]

# Schemas that leave values unbounded: with caps they finish before max_tokens and validate.
UNBOUNDED: list[dict] = [
    {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}, "required": ["n", "s"],
     "additionalProperties": False},
    {"type": "integer"},
    {"type": "number"},
    {"type": "array", "items": {"type": "string"}, "maxItems": 2},
]
