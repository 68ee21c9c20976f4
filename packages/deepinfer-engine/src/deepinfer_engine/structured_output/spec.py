"""`StructuredOutput`: the typed constraint a request may carry (no xgrammar import here).

    SamplingParams(structured_output=StructuredOutput.json_schema({"type": "object", ...}))
    SamplingParams(structured_output=StructuredOutput.regex(r"\\d{3}-\\d{4}"))
    SamplingParams(structured_output=StructuredOutput.grammar('root ::= "yes" | "no"'))  # EBNF (GBNF)
    SamplingParams(structured_output=StructuredOutput.json_object())                     # any JSON object

JSON whitespace is bounded by default (`any_whitespace=False`: one fixed separator style, ", "
and ": ", no free whitespace), so a random or weak model cannot spin in whitespace forever.
`any_whitespace=True` allows free whitespace, at most `max_whitespace_cnt` characters per gap
(default 4; None = unbounded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from deepinfer_engine.errors import InvalidRequestError

Kind = Literal["json_schema", "regex", "grammar", "json_object"]
KINDS: tuple[str, ...] = ("json_schema", "regex", "grammar", "json_object")
FIELD = "structured_output"
MAX_CAP = 4096   # the largest max_string_length / max_integer_digits


@dataclass(frozen=True)
class StructuredOutput:
    kind: Kind
    value: str | None = None        # JSON schema text (canonical), regex, or EBNF; None for json_object
    any_whitespace: bool = False
    max_whitespace_cnt: int | None = 4
    max_string_length: int | None = None    # json_schema: maxLength for strings the schema leaves unbounded
    max_integer_digits: int | None = None   # json_schema: +-(10**d - 1) bounds for unbounded integers / numbers

    # ------------------------------------------------------------------ constructors
    @classmethod
    def json_schema(cls, schema: dict | str | bool, *, any_whitespace: bool = False,
                    max_whitespace_cnt: int | None = 4, max_string_length: int | None = None,
                    max_integer_digits: int | None = None) -> StructuredOutput:
        """A JSON schema the output must validate against. Keywords the grammar backend cannot
        enforce are refused at validation, naming the keyword (schema_check.py).
        `max_string_length` / `max_integer_digits` cap what the schema leaves unbounded (a string
        without maxLength / pattern / enum; an integer or number without minimum / maximum), so a
        weak model cannot spend max_tokens on one value; output under a cap still validates."""
        return cls("json_schema", _schema_text(schema), any_whitespace, max_whitespace_cnt,
                   max_string_length, max_integer_digits)

    @classmethod
    def regex(cls, pattern: str) -> StructuredOutput:
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, ebnf: str) -> StructuredOutput:
        return cls("grammar", ebnf)

    @classmethod
    def json_object(cls, *, any_whitespace: bool = False, max_whitespace_cnt: int | None = 4) -> StructuredOutput:
        return cls("json_object", None, any_whitespace, max_whitespace_cnt)

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Cheap, synchronous checks; grammar errors proper surface when it compiles."""
        if self.kind not in KINDS:
            raise InvalidRequestError(FIELD, f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "json_object":
            if self.value is not None:
                raise InvalidRequestError(FIELD, "json_object takes no value")
        elif not isinstance(self.value, str) or not self.value:
            raise InvalidRequestError(FIELD, f"{self.kind} must be a non-empty string, got {self.value!r}")
        if self.kind == "json_schema":
            self.checked_schema()
        for name in ("max_string_length", "max_integer_digits"):
            cap = getattr(self, name)
            if cap is not None and (self.kind != "json_schema" or not isinstance(cap, int) or isinstance(cap, bool)
                                    or not (1 <= cap <= MAX_CAP)):
                raise InvalidRequestError(FIELD, f"{name} must be None or an integer in [1, {MAX_CAP}] "
                                          f"(json_schema only), got {cap!r}")
        if not isinstance(self.any_whitespace, bool):
            raise InvalidRequestError(FIELD, f"any_whitespace must be a bool, got {self.any_whitespace!r}")
        w = self.max_whitespace_cnt
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
            raise InvalidRequestError(FIELD, f"max_whitespace_cnt must be None or an integer >= 1, got {w!r}")

    def checked_schema(self) -> Any:
        """The json_schema as the grammar will enforce it (allOf merged, caps applied); raises
        InvalidRequestError naming a keyword the grammar backend cannot enforce."""
        from deepinfer_engine.structured_output.schema_check import SchemaNotEnforceable, apply_caps, check_schema
        schema = json.loads(_schema_text(self.value))
        try:
            checked = check_schema(schema)
        except SchemaNotEnforceable as err:
            raise InvalidRequestError(FIELD, f"json_schema: {err}") from None
        return apply_caps(checked, self.max_string_length, self.max_integer_digits)

    @property
    def cache_key(self) -> tuple:
        ws = (self.any_whitespace, self.max_whitespace_cnt if self.any_whitespace else None)
        return (self.kind, self.value, ws if self.kind in ("json_schema", "json_object") else None,
                self.max_string_length, self.max_integer_digits)

    def describe(self) -> str:
        v = self.value if self.value is None or len(self.value) <= 60 else self.value[:57] + "..."
        return f"{self.kind}({v!r})" if v is not None else self.kind


def _schema_text(schema: Any) -> str:
    """A JSON schema as compact text. Key order is kept (xgrammar emits properties in schema order),
    so a dict and its json.dumps share one cache key."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as err:
            raise InvalidRequestError(FIELD, f"json_schema is not valid JSON: {err}") from None
    if schema is False:
        raise InvalidRequestError(FIELD, "json_schema: the schema false accepts no value")
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise InvalidRequestError(FIELD, f"json_schema must be a dict or a JSON object string, got {type(schema).__name__}")
    try:
        return json.dumps(schema, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise InvalidRequestError(FIELD, f"json_schema is not JSON-serialisable: {err}") from None


def coerce(value: Any) -> StructuredOutput | None:
    """SamplingParams.structured_output accepts a StructuredOutput or a one-key dict
    ({"json_schema": ...} | {"regex": ...} | {"grammar": ...} | {"json_object": True})."""
    if value is None or isinstance(value, StructuredOutput):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (k, v), = value.items()
        if k == "json_schema":
            return StructuredOutput.json_schema(v)
        if k == "regex" and isinstance(v, str):
            return StructuredOutput.regex(v)
        if k == "grammar" and isinstance(v, str):
            return StructuredOutput.grammar(v)
        if k == "json_object" and v is True:
            return StructuredOutput.json_object()
    raise InvalidRequestError(FIELD, "expected a StructuredOutput or a one-key dict "
                                     f"{{'json_schema'|'regex'|'grammar': ...}} / {{'json_object': True}}, got {value!r}")
