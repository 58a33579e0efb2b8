"""Text <-> token ids for any checkpoint in the published layout.

Reads ``tokenizer.json`` with HF ``tokenizers`` and the chat template from
``tokenizer_config.json`` (or ``chat_template.jinja``), and knows the end-of-sequence ids from
``generation_config.json`` / ``config.json``. A checkpoint may have no tokenizer at all
(``from_dir_optional`` then gives None: ids in, ids out). It knows nothing about models or sampling.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer


class TokenizerError(ValueError):
    pass


class Tokenizer:
    def __init__(
        self,
        tok: _HFTokenizer,
        chat_template: str | None,
        eos_token_ids: tuple[int, ...],
        special_ids: frozenset[int],
    ):
        self._tok = tok
        self.chat_template = chat_template
        self.eos_token_ids = eos_token_ids
        self.special_ids = special_ids

    @classmethod
    def from_dir(cls, path: str | Path, eos_token_ids: tuple[int, ...] = ()) -> Tokenizer:
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(f"no tokenizer.json in {path}")
        try:
            tok = _HFTokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise TokenizerError(f"cannot read {file}: {e}") from e
        config = _read_json(path / "tokenizer_config.json")
        template = config.get("chat_template")
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        if not eos_token_ids:
            gen = _read_json(path / "generation_config.json")
            eos = gen.get("eos_token_id")
            eos_token_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        specials = frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
        return cls(tok, template, tuple(int(e) for e in eos_token_ids), specials)

    @classmethod
    def from_dir_optional(cls, path: str | Path,
                          eos_token_ids: tuple[int, ...] = ()) -> Tokenizer | None:
        """``from_dir``, or None for a directory without ``tokenizer.json`` (token ids in and
        out need no tokenizer, e.g. a bare model written by transformers' ``save_pretrained``);
        a tokenizer.json that is there but unreadable is still an error."""
        if not (Path(path) / "tokenizer.json").is_file():
            return None
        return cls.from_dir(path, eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """``kwargs``: the template's own variables (``tools``, ``enable_thinking``...)."""
        if not self.chat_template:
            raise TokenizerError("this checkpoint's tokenizer has no chat template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson  # as transformers renders templates (GLM's use it)
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **kwargs
            )
        except jinja2.TemplateError as e:
            raise TokenizerError(f"chat template failed: {e}") from e


def _tojson(value, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson`` filter: plain ``json.dumps`` (jinja's own escapes HTML and
    takes no ``ensure_ascii``, so a template would render differently here and there)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
