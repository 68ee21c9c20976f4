"""Chat messages -> prompt token ids, with user text never becoming a control token.

The default model completes Python; it was never tuned for dialogue. Its template therefore
renders a conversation as source code the model knows how to continue: each system / user
message becomes a docstring (the request written down as code documentation), each assistant
message is code, and the generation prompt is the line after the last docstring::

    <3 double quotes>Write a function that adds two numbers.<3 double quotes>
    <the model writes code here>

A checkpoint brings its own template (`chat_template` in tokenizer_config.json, rendered with
jinja2 in a sandbox, with `messages`, `add_generation_prompt`, `bos_token`, `eos_token`).

Safety: the template is rendered with each message's content replaced by an unguessable
sentinel; the rendered text is split at the sentinels, the template's own text is encoded with
special tokens recognised (so `<|user|>` in a template is one control token), the user's content
with special tokens treated as plain text (so "<|eos|>" typed by a user is the characters
"<", "|", "eos" ... and never token 2). A template that alters content (a filter on it) cannot
be rendered this way and is refused with a clear error.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{ message['content'] }}{{ '\\n' }}"
    "{%- else -%}{{ '\"\"\"' }}{{ message['content'] }}{{ '\"\"\"\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


class ChatTemplateError(ValueError):
    pass


def load_chat_template(model_dir: str | Path | None) -> str:
    """The checkpoint's chat template (tokenizer_config.json), else the default model's."""
    if model_dir is not None:
        cfg = Path(model_dir) / "tokenizer_config.json"
        if cfg.is_file():
            template = json.loads(cfg.read_text()).get("chat_template")
            if isinstance(template, list):   # [{"name": "default", "template": ...}, ...]
                template = next((t["template"] for t in template if t.get("name") == "default"), None)
            if isinstance(template, str) and template:
                return template
    return DEFAULT_CHAT_TEMPLATE


class PlainEncoder:
    """Text -> ids with special tokens never recognised (user text), or recognised (template text)."""

    def __init__(self, tokenizer):
        from tokenizers import Tokenizer
        backend = tokenizer.backend
        self._control = backend
        self._plain = Tokenizer.from_str(backend.to_str())
        self._plain.encode_special_tokens = True   # "<|eos|>" in the input is plain text

    def encode_plain(self, text: str) -> list[int]:
        return self._plain.encode(text, add_special_tokens=False).ids if text else []

    def encode_control(self, text: str) -> list[int]:
        return self._control.encode(text, add_special_tokens=False).ids if text else []


class ChatRenderer:
    def __init__(self, template: str, encoder: PlainEncoder, bos_token: str = "", eos_token: str = ""):
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str):
            raise ChatTemplateError(message)
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(template)
        self.encoder = encoder
        self.bos_token, self.eos_token = bos_token, eos_token

    def render_ids(self, messages: list[tuple[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """[(role, content)] -> prompt token ids (raises ChatTemplateError)."""
        nonce = secrets.token_hex(8)
        marks = [f"\ue000{nonce}:{i}\ue001" for i in range(len(messages))]
        try:
            text = self.template.render(
                messages=[{"role": r, "content": m} for (r, _), m in zip(messages, marks)],
                add_generation_prompt=add_generation_prompt, bos_token=self.bos_token, eos_token=self.eos_token)
        except ChatTemplateError:
            raise
        except Exception as err:  # noqa: BLE001 - a template error is the request's (or the checkpoint's)
            raise ChatTemplateError(f"chat template failed: {err}") from None
        ids: list[int] = []
        rest = text
        for (_, content), mark in zip(messages, marks):
            head, sep, rest = rest.partition(mark)
            if not sep or mark in rest:
                raise ChatTemplateError("the model's chat template alters message content; it cannot be "
                                        "rendered safely (each message must appear exactly once, verbatim)")
            ids += self.encoder.encode_control(head) + self.encoder.encode_plain(content)
        return ids + self.encoder.encode_control(rest)
