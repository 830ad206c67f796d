"""Prompts rendered with a tokenizer that has a chat template and one that has none."""

import pytest
from transformers import AutoTokenizer

from evora.errors import ConfigError
from evora.tasks.base import Example
from evora.tasks.prompts import PromptRenderer

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
EXAMPLE = Example("What is 2+3?", "5", prefix="Sure: ")


@pytest.fixture()
def plain_tokenizer(tiny_path):
    return AutoTokenizer.from_pretrained(tiny_path)  # the tiny tokenizer has no chat template


@pytest.fixture()
def chat_tokenizer(tiny_path):
    tok = AutoTokenizer.from_pretrained(tiny_path)
    tok.chat_template = TEMPLATE
    return tok


def test_plain_text_without_a_template(plain_tokenizer):
    renderer = PromptRenderer(plain_tokenizer, "auto", "Q: {prompt}\nA: ")
    assert not renderer.chat
    assert renderer.text(EXAMPLE) == "Q: What is 2+3?\nA: Sure: "
    ids = renderer.ids(EXAMPLE)
    assert ids[0] == plain_tokenizer.bos_token_id and plain_tokenizer.decode(ids[1:]) == renderer.text(EXAMPLE)


def test_chat_template_when_the_tokenizer_has_one(chat_tokenizer):
    renderer = PromptRenderer(chat_tokenizer, "auto", "Q: {prompt}\nA: ", system_prompt="Be brief.")
    assert renderer.chat
    text = renderer.text(EXAMPLE)
    assert text == "<|system|>Be brief.\n<|user|>What is 2+3?\n<|assistant|>Sure: "
    # the template's text is tokenized without a second set of special tokens
    assert renderer.ids(EXAMPLE) == chat_tokenizer(text, add_special_tokens=False).input_ids


def test_format_can_be_forced(chat_tokenizer, plain_tokenizer):
    assert not PromptRenderer(chat_tokenizer, "plain").chat
    with pytest.raises(ConfigError, match="task.prompt_format=chat: the model's tokenizer has no chat template"):
        PromptRenderer(plain_tokenizer, "chat")


def test_rendered_prompts_are_used_as_they_are(chat_tokenizer):
    example = Example("ignored", "5", rendered="Full prompt from the data <think>")
    assert PromptRenderer(chat_tokenizer, "auto").text(example) == "Full prompt from the data <think>"


def test_target_ids_end_with_eos(plain_tokenizer):
    renderer = PromptRenderer(plain_tokenizer, "plain")
    ids = renderer.target_ids(Example("q", "46"))
    assert ids[-1] == plain_tokenizer.eos_token_id and plain_tokenizer.decode(ids[:-1]) == "46"
