"""Issue 9 test data: 30 JSON schemas (bounded, so a random model finishes them), regexes, EBNF grammars."""

S = {"type": "string", "maxLength": 6}
I = {"type": "integer", "minimum": -50, "maximum": 50}

JSON_SCHEMAS: list[dict] = [
    # flat objects
    {"type": "object", "properties": {"a": I}, "required": ["a"]},
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"}}, "required": ["ok", "none"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"v": {"const": 42}, "w": {"type": "string", "enum": ["a", "b"]}},
     "required": ["v", "w"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}}, "required": ["code"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 20}}, "required": ["n"]},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 4}}, "required": ["s"]},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["x"]},
    {"type": "object", "properties": {"id": I, "tag": S, "flag": {"type": "boolean"}}, "required": ["id", "tag", "flag"]},
    # arrays
    {"type": "object", "properties": {"xs": {"type": "array", "items": I, "maxItems": 3}}, "required": ["xs"]},
    {"type": "object", "properties": {"xs": {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 1,
                                             "maxItems": 4}}, "required": ["xs"]},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
    {"type": "array", "items": S, "maxItems": 2},
    {"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [I, S], "items": False}},
     "required": ["pair"]},
    # nested objects
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": I, "name": S},
                                               "required": ["id", "name"]}}, "required": ["user"]},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "boolean"}}, "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"k": S, "v": I}, "required": ["k", "v"]}}}, "required": ["items"]},
    {"type": "object", "properties": {"meta": {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}}, "required": ["tags"]}}, "required": ["meta"]},
    # $ref / $defs
    {"$defs": {"pt": {"type": "object", "properties": {"x": I, "y": I}, "required": ["x", "y"]}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}}, "required": ["a", "b"]},
    {"$defs": {"name": {"type": "string", "pattern": "^[a-z]{1,5}$"}},
     "type": "object", "properties": {"first": {"$ref": "#/$defs/name"}}, "required": ["first"]},
    {"$defs": {"item": {"enum": ["apple", "pear"]}},
     "type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3},
    # anyOf / oneOf-like unions
    {"type": "object", "properties": {"v": {"anyOf": [I, {"type": "boolean"}]}}, "required": ["v"]},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "null"}, S]}}, "required": ["v"]},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "n": I}, "required": ["kind", "n"]},
               {"type": "object", "properties": {"kind": {"const": "b"}, "ok": {"type": "boolean"}},
                "required": ["kind", "ok"]}]},
    {"type": "object", "properties": {"xs": {"type": "array", "maxItems": 3, "items": {"anyOf": [I, {"enum": ["z"]}]}}},
     "required": ["xs"]},
    # optional properties and patterns
    {"type": "object", "properties": {"a": I, "b": {"type": "boolean"}}, "required": ["a"]},
    {"type": "object", "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
     "required": ["date"]},
    {"type": "object", "properties": {"hex": {"type": "string", "pattern": "^0x[0-9a-f]{2,4}$"},
                                      "n": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["hex", "n"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}}, "required": ["matrix"]},
]

REGEXES: list[str] = [
    r"[a-z]{2,5}-\d{2}",
    r"(yes|no|maybe)",
    r"\d{3}\.\d{2}",
    r"[A-Z][a-z]{1,6}( [A-Z][a-z]{1,6}){0,2}",
    r"(0|[1-9]\d{0,2})(,\d{3}){0,2}",
    r"#[0-9a-f]{6}",
]

# (grammar, python checker of the full output text)
EBNF_GRAMMARS: list[str] = [
    'root ::= "yes" | "no"',
    'root ::= expr\nexpr ::= term (("+" | "-") term){0,3}\nterm ::= [0-9] | "(" expr ")"',
    'root ::= "[" (item ("," item){0,3})? "]"\nitem ::= [a-c]{1,3}',
    'root ::= greeting " " name "!"\ngreeting ::= "hi" | "hello"\nname ::= [A-Z] [a-z]{0,4}',
]


def check_ebnf(index: int, text: str) -> bool:
    """Independent (non-xgrammar) checkers of EBNF_GRAMMARS."""
    import re
    if index == 0:
        return text in ("yes", "no")
    if index == 1:
        pos = 0

        def expr(depth: int) -> bool:
            nonlocal pos
            if not term(depth):
                return False
            for _ in range(3):
                if pos < len(text) and text[pos] in "+-":
                    pos += 1
                    if not term(depth):
                        return False
                else:
                    break
            return True

        def term(depth: int) -> bool:
            nonlocal pos
            if pos < len(text) and text[pos].isdigit():
                pos += 1
                return True
            if pos < len(text) and text[pos] == "(":
                pos += 1
                if not expr(depth + 1) or pos >= len(text) or text[pos] != ")":
                    return False
                pos += 1
                return True
            return False

        return expr(0) and pos == len(text)
    if index == 2:
        return re.fullmatch(r"\[([a-c]{1,3}(,[a-c]{1,3}){0,3})?\]", text) is not None
    if index == 3:
        return re.fullmatch(r"(hi|hello) [A-Z][a-z]{0,4}!", text) is not None
    raise IndexError(index)
