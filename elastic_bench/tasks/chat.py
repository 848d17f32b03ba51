"""Conversations through a tokenizer's chat template: a system message, several turns (MRCR's multi-turn prompts).

`elastic_bench.tasks.base.render` covers one user turn (plus an assistant prefix); `render_messages` takes the whole
message list an upstream harness sends to a chat API.
"""

from __future__ import annotations


class NoChatTemplateError(ValueError):
    """A conversation of several turns given to a tokenizer without a chat template."""


def render_messages(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Tokens of ``messages`` (``{"role", "content"}`` dicts, the last one the user's) followed by the assistant's
    generation prompt, through the tokenizer's chat template.

    A system message the template rejects (some templates raise on the role) is dropped, as HELMET does. Without a
    chat template, a single user message (after any system message, which is dropped) is tokenised as plain text with
    the tokenizer's default special tokens, as `elastic_bench.tasks.base.render` does.

    Raises:
        NoChatTemplateError: several turns and no chat template to lay them out.
    """
    if not getattr(tokenizer, "chat_template", None):
        turns = [m for m in messages if m["role"] != "system"]
        if len(turns) != 1:
            raise NoChatTemplateError(f"a conversation of {len(turns)} turns needs a tokenizer with a chat template")
        return tokenizer(turns[0]["content"]).input_ids

    def text(chat: list[dict[str, str]]) -> str:
        # enable_thinking: Qwen3 answers directly, as `render` asks; other templates ignore it
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, enable_thinking=False)

    try:
        rendered = text(messages)
    except Exception:  # noqa: BLE001  (a template that refuses the system role raises its own error type)
        if messages[0]["role"] != "system":
            raise
        rendered = text(messages[1:])
    return tokenizer(rendered, add_special_tokens=False).input_ids
