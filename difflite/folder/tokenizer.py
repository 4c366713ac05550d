"""Prompt -> token ids for the text encoder, without importing transformers (about 2.5 s here).

`convert` writes OUT/tokenizer/tokenizer.json: the tokenizers-library pipeline that transformers'
CLIPTokenizer runs (normaliser, pre-tokeniser, BPE model, BOS/EOS post-processor), serialised by
that library. Loading it with `tokenizers` alone and applying what the Stable Diffusion pipelines
ask of the tokenizer (truncate to max_length with BOS and EOS kept, pad to max_length with the pad
token) gives the ids diffusers gets. A folder without tokenizer.json (converted before difflite
wrote it) is bad input: convert it again."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from difflite.core.errors import BadInput

PIPELINE_FILE = "tokenizer.json"


class PromptTokenizer:
    def __init__(self, folder, max_length: int):
        self.folder = Path(folder)
        self.max_length = int(max_length)
        if not (self.folder / PIPELINE_FILE).is_file():
            raise BadInput(f"{self.folder / PIPELINE_FILE}: missing (the folder was converted by an older "
                           f"difflite; convert it again)")
        self._encode = self._tokenizers_encoder()

    def __call__(self, text: str) -> np.ndarray:
        """int32 ids [1, max_length]."""
        ids = self._encode(text)
        return np.asarray(ids, dtype=np.int32).reshape(1, self.max_length)

    def _tokenizers_encoder(self):
        from tokenizers import Tokenizer

        path = self.folder / PIPELINE_FILE
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own Exception type for any bad file
            raise BadInput(f"{path}: cannot load the tokenizer ({str(exc).splitlines()[0]})") from exc
        pad_token = self._pad_token()
        pad_id = tokenizer.token_to_id(pad_token)
        if pad_id is None:
            raise BadInput(f"{path}: the pad token {pad_token!r} is not in the vocabulary")
        tokenizer.enable_truncation(max_length=self.max_length)
        tokenizer.enable_padding(length=self.max_length, pad_id=pad_id, pad_token=pad_token)
        return lambda text: tokenizer.encode(text).ids

    def _pad_token(self) -> str:
        path = self.folder / "special_tokens_map.json"
        try:
            special = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BadInput(f"{path}: cannot read the special tokens ({exc})") from exc
        pad = special.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        if not isinstance(pad, str):
            raise BadInput(f"{path}: no pad_token")
        return pad


def save_pipeline(pipeline_json: str, folder) -> None:
    """Write a tokenizers-library pipeline (a transformers tokenizer's backend_tokenizer.to_str())
    as OUT/tokenizer/tokenizer.json."""
    (Path(folder) / PIPELINE_FILE).write_text(pipeline_json, encoding="utf-8")


__all__ = ["PIPELINE_FILE", "PromptTokenizer", "save_pipeline"]
