"""The character tokenizer of the tiny policy, and prompt formatting for any tokenizer.

Every character is one token: a fixed vocabulary of four special tokens, ``\\n``,
``\\t``, printable ASCII and a few maths symbols; anything else maps to ``<unk>``.
It is a ``tokenizers`` word-level model behind a ``Split([\\s\\S])`` pre-tokenizer
(``.`` would not match newlines and ``\\n\\n`` would collapse into one ``<unk>``)
and a ``Fuse`` decoder, wrapped as a ``transformers.PreTrainedTokenizerFast`` so
that ``save_pretrained`` / ``from_pretrained`` and chat templates work.

The chat template renders a DAPO ``prompt`` message list as the user contents
followed by :data:`RESPONSE_SEPARATOR`; the response starts right after it and
ends with ``<eos>``. No BOS is added: the prompt starts at its first character.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD, EOS, UNK, BOS = "<pad>", "<eos>", "<unk>", "<bos>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, UNK, BOS)
"""Special tokens, ids 0-3 in this order."""

CHARACTERS: tuple[str, ...] = (
    "\n",
    "\t",
    *(chr(c) for c in range(32, 127)),  # printable ASCII, space included
    *"×÷−±≤≥≠≈·π√∞°",  # a few symbols that appear in maths text
)
"""The character vocabulary, ids 4 onwards in this order."""

RESPONSE_SEPARATOR = "\n"
"""What the chat template puts between the prompt and the response (kept in sync with
:data:`CHAT_TEMPLATE` by a test)."""

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '\\n' }}{{ message['content'] }}{{ eos_token }}"
    "{%- else -%}"
    "{%- if not loop.first -%}{{ '\\n\\n' }}{%- endif -%}"
    "{{ message['content'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '\\n' }}"
    "{%- endif -%}"
)
"""Jinja chat template: system/user contents joined by blank lines, then the separator.

``[{"role": "user", "content": "What is 1+2?"}]`` with ``add_generation_prompt``
renders as ``"What is 1+2?\\n"``; an assistant message renders as separator,
content, ``<eos>``.
"""


def char_vocab() -> dict[str, int]:
    """Token -> id for the special tokens followed by :data:`CHARACTERS`."""
    return {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh character tokenizer (pad 0, eos 1, unk 2, bos 3; no tokens added on encode)."""
    core = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        bos_token=BOS,
        clean_up_tokenization_spaces=False,  # " ." must stay " ." (the default would rewrite it)
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


def format_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str]]) -> str:
    """Render a DAPO ``prompt`` message list into the text the policy continues.

    Uses the tokenizer's chat template (``add_generation_prompt=True``, untokenised) when it has one,
    rendered as ``apply_chat_template`` renders it but bounded in time and memory
    (:func:`dapo_cli.models.chat_template.render_prompt`: the template is the model folder's code, and
    may misbehave only on some content); otherwise joins the user contents with blank lines.
    """
    from dapo_cli.models.chat_template import render_prompt

    msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        return render_prompt(tokenizer, msgs)
    return "\n\n".join(m["content"] for m in msgs if m["role"] == "user")
