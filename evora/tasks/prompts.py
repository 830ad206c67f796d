"""Prompts rendered to token ids, with the tokenizer's chat template or as plain text.

Both engines receive these ids, so vLLM and transformers see identical inputs, and a
chat template's own BOS is never doubled by a second tokenizer pass.
"""

from __future__ import annotations

from typing import Any, Mapping

from evora.errors import ConfigError
from evora.tasks.base import Example

FORMATS = ("auto", "chat", "plain")


def uses_chat_template(tokenizer: Any, prompt_format: str) -> bool:
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if prompt_format == "chat" and not has_template:
        raise ConfigError("task.prompt_format=chat: the model's tokenizer has no chat template; allowed: auto, plain")
    return prompt_format == "chat" or (prompt_format == "auto" and has_template)


class PromptRenderer:
    def __init__(
        self,
        tokenizer: Any,
        prompt_format: str,
        plain_template: str | Mapping[str, str] = "{prompt}",
        system_prompt: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.chat = uses_chat_template(tokenizer, prompt_format)
        self.plain_template = plain_template  # one template, or one per family (task=mix)
        self.system_prompt = system_prompt

    def text(self, example: Example) -> str:
        if example.rendered is not None:
            return example.rendered
        if self.chat:
            messages = [{"role": "user", "content": example.prompt}]
            if self.system_prompt:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            opening = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return opening + example.prefix
        system = f"{self.system_prompt}\n\n" if self.system_prompt else ""
        template = self.plain_template
        if not isinstance(template, str):
            template = template[example.family]
        return system + template.format(prompt=example.prompt) + example.prefix

    def ids(self, example: Example) -> list[int]:
        # A chat template writes its own special tokens; plain text gets the tokenizer's (e.g. BOS).
        special = not self.chat or example.rendered is not None
        return self.tokenizer(self.text(example), add_special_tokens=special).input_ids

    def target_ids(self, example: Example) -> list[int]:
        """The reference completion, ended by EOS: what perplexity and supervised training score."""
        ids = self.tokenizer(example.reference, add_special_tokens=False).input_ids
        eos = self.tokenizer.eos_token_id
        return ids + ([eos] if eos is not None else [])
