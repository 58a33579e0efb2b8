"""A small byte-level tokenizer for checkpoints glmlab writes itself.

Ids 0..255 are the raw bytes (so any text round-trips), then GLM's special tokens in a fixed order.
The files are the standard Hugging Face ones (``tokenizer.json``, ``tokenizer_config.json`` with a
GLM-style chat template), so transformers' ``AutoTokenizer`` and ``glmlab.tokenizer.Tokenizer``
read them exactly like the released tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
    "<|mask|>",  # the block-drafting mask token (DFlash2)
)
TINY_SPECIALS = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}

# GLM-4.5 / 4.7's layout: the tools, when a request has them, are listed in a system turn of their
# own before the conversation, one JSON object per line inside <tools></tools>, followed by the call
# format the model answers in (what the glm45 / glm47 tool-call parsers read); an assistant turn
# replays its calls in that format, and consecutive tool results share one <|observation|> turn.
TOOLS_PREAMBLE = (
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query."
    "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FORMAT = (
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>"
    "{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>"
    "...</tool_call>"
)
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- if tools -%}"
    "{{ '" + TOOLS_PREAMBLE.replace("\n", "\\n") + "' }}"
    "{%- for tool in tools -%}{{ tool | tojson(ensure_ascii=False) }}{{ '\\n' }}{%- endfor -%}"
    "{{ '" + TOOLS_FORMAT.replace("\n", "\\n") + "' }}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|system|>\n{{ m['content'] }}"
    "{%- elif m['role'] == 'user' -%}<|user|>\n{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}<|assistant|>\n{{ m['content'] or '' }}"
    "{%- for tc in m.get('tool_calls') or [] -%}"
    "{%- set f = tc['function'] if tc.get('function') else tc -%}"
    "<tool_call>{{ f['name'] }}"
    "{%- set args = f.get('arguments') or {} -%}"
    "{%- if args is mapping -%}{%- for k, v in args.items() -%}"
    "<arg_key>{{ k }}</arg_key><arg_value>"
    "{{ v if v is string else v | tojson(ensure_ascii=False) }}</arg_value>"
    "{%- endfor -%}{%- endif -%}"
    "</tool_call>"
    "{%- endfor -%}"
    "{%- elif m['role'] in ('tool', 'observation') -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] not in ('tool', 'observation') -%}"
    "<|observation|>"
    "{%- endif -%}"
    "{{ '\\n<tool_response>\\n' }}{{ m['content'] }}{{ '\\n</tool_response>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>\n{% endif -%}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """The printable stand-in character the ByteLevel pre-tokenizer uses for each byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def build_byte_tokenizer() -> Tokenizer:
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def write_tokenizer_files(out: Path, eos_ids: list[int], pad_id: int | None) -> None:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json into ``out``."""
    tok = build_byte_tokenizer()
    for name, idx in TINY_SPECIALS.items():
        if tok.token_to_id(name) != idx:
            raise AssertionError(f"special token {name} got id {tok.token_to_id(name)}, not {idx}")
    tok.save(str(out / "tokenizer.json"))
    id_to_tok = {v: k for k, v in TINY_SPECIALS.items()}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        # a real-vocab config's end ids lie beyond this byte tokenizer: it ends on <|endoftext|>
        "eos_token": id_to_tok.get(eos_ids[0], "<|endoftext|>"),
        "pad_token": id_to_tok.get(pad_id, "<|endoftext|>"),
        "model_max_length": 1048576,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "special": True,
                "normalized": False,
                "lstrip": False,
                "rstrip": False,
                "single_word": False,
            }
            for t, i in TINY_SPECIALS.items()
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {"eos_token_id": eos_ids, "pad_token_id": pad_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
