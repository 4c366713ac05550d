"""Prompt -> token ids for the text encoder, without importing transformers (about 2.5 s here).

`convert` writes OUT/tokenizer/tokenizer.json: the tokenizers-library pipeline that transformers'
CLIPTokenizer runs (normaliser, pre-tokeniser, BPE model, BOS/EOS post-processor), serialised by
that library. Loading it with `tokenizers` alone and applying what the Stable Diffusion pipelines
ask of the tokenizer (truncate to max_length with BOS and EOS kept, pad to max_length with the pad
token) gives the ids diffusers gets. A folder without tokenizer.json (converted before difflite
wrote it) is bad input: convert it again.

A prompt is taken in any bytes (clean_prompt), and every token id the pipeline names is checked
against int32 and the text encoder's vocabulary before the library loads it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from difflite.core.errors import BadInput
from difflite.core.jsonfile import read_json

PIPELINE_FILE = "tokenizer.json"
INT32_IDS = 2**31  # the text encoder's input_ids are int32


def clean_prompt(text: str | bytes) -> str:
    """The prompt as a shell user means it: bytes that are not UTF-8, given as bytes or as the
    surrogate escapes Python decodes such argv bytes to, become U+FFFD, as does a lone surrogate."""
    if isinstance(text, str):
        try:
            text = text.encode("utf-8", "surrogateescape")  # argv's undecodable bytes back as bytes
        except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
            text = text.encode("utf-8", "surrogatepass")
    return bytes(text).decode("utf-8", "replace")


class PromptTokenizer:
    def __init__(self, folder, max_length: int, vocabulary: int | None = None):
        """`vocabulary`: the rows of the text encoder's token table, which every token id must be
        below (None: int32 only)."""
        self.folder = Path(folder)
        self.max_length = int(max_length)
        path = self.folder / PIPELINE_FILE
        if not path.is_file():
            raise BadInput(f"{path}: missing (the folder was converted by an older difflite; convert it again)")
        check_token_ids(path, read_json(path, what="tokenizer pipeline"), vocabulary)
        self._encode = self._tokenizers_encoder()

    def __call__(self, text: str | bytes) -> np.ndarray:
        """int32 ids [1, max_length]."""
        ids = self._encode(clean_prompt(text))
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
        special = read_json(path, what="special tokens map")
        pad = special.get("pad_token") if isinstance(special, dict) else None
        pad = pad.get("content") if isinstance(pad, dict) else pad
        if not isinstance(pad, str):
            raise BadInput(f"{path}: no pad_token")
        return pad


def check_token_ids(path: Path, pipeline, vocabulary: int | None) -> None:
    """Every token id of the tokenizers-library `pipeline` (read from `path`) is an int below
    int32's end and `vocabulary`: the ids the text encoder can look up."""
    if not isinstance(pipeline, dict):
        raise BadInput(f"{path}: not a tokenizer pipeline (expected a JSON object)")
    limit = min(INT32_IDS, vocabulary or INT32_IDS)
    for where, token_id in _token_ids(pipeline):
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < INT32_IDS:
            raise BadInput(f"{path}: token id {_shown(token_id)} of {where} is no int32 id (0 to {INT32_IDS - 1})")
        if token_id >= limit:
            raise BadInput(f"{path}: token id {token_id} of {where} is beyond the text encoder's vocabulary "
                           f"({vocabulary} tokens)")


def _token_ids(pipeline: dict) -> Iterator[tuple[str, object]]:
    """(where, id) for each token id the pipeline names: its model's vocabulary, added tokens,
    post-processor and padding. Parts of another shape are left to the library to judge."""
    model = pipeline.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        yield from ((f"token {_shown(token)}", token_id) for token, token_id in vocab.items())
    elif isinstance(vocab, list) and vocab:  # a Unigram model: the ids are the positions
        yield f"the last of {len(vocab)} tokens", len(vocab) - 1
    for added in _listed(pipeline.get("added_tokens")):
        if isinstance(added, dict):
            yield f"added token {_shown(added.get('content'))}", added.get("id")
    yield from _processor_ids(pipeline.get("post_processor"))
    padding = pipeline.get("padding")
    if isinstance(padding, dict) and "pad_id" in padding:
        yield "padding", padding["pad_id"]


def _processor_ids(processor) -> Iterator[tuple[str, object]]:
    """The ids of a post-processor: Roberta's and Bert's [token, id] pairs, a template's
    special tokens, a sequence's processors."""
    if not isinstance(processor, dict):
        return
    for key in ("cls", "sep"):
        pair = processor.get(key)
        if isinstance(pair, list) and len(pair) == 2:
            yield f"the post-processor's {key} token", pair[1]
    specials = processor.get("special_tokens")
    for name, special in (specials.items() if isinstance(specials, dict) else ()):
        for token_id in _listed(special.get("ids") if isinstance(special, dict) else None):
            yield f"the post-processor's special token {_shown(name)}", token_id
    for inner in _listed(processor.get("processors")):
        yield from _processor_ids(inner)


def _listed(value) -> list:
    return value if isinstance(value, list) else []


def _shown(value, limit: int = 60) -> str:
    """repr(value) for a one-line message, cut to `limit` characters (a hostile file's token may
    be any length)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def save_pipeline(pipeline_json: str, folder) -> None:
    """Write a tokenizers-library pipeline (a transformers tokenizer's backend_tokenizer.to_str())
    as OUT/tokenizer/tokenizer.json."""
    (Path(folder) / PIPELINE_FILE).write_text(pipeline_json, encoding="utf-8")


__all__ = ["PIPELINE_FILE", "PromptTokenizer", "check_token_ids", "clean_prompt", "save_pipeline"]
