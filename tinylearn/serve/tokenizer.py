"""ByteTokenizer: the tiny served model's tokenizer -- UTF-8 bytes are tokens 0..255, then BOS and EOS.

No vocabulary file and no download: any text round-trips (``decode(encode(s)) == s``). Incremental decoding for
streaming: ``decode`` uses errors="replace", and ``stream_text(ids, emitted)`` returns only the text that is
complete (a multi-byte character split across tokens is held back until its last byte arrives).
"""

from __future__ import annotations

from typing import Any

BOS, EOS = 256, 257
VOCAB_SIZE = 258


class ByteTokenizer:
    vocab_size = VOCAB_SIZE
    bos_token_id = BOS
    eos_token_id = EOS

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return [BOS, *ids] if add_bos else ids

    def decode(self, ids: Any) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def stream_text(self, ids: Any) -> str:
        """The decoded text of ``ids`` without a trailing incomplete UTF-8 sequence (held back for the next call)."""
        b = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        for cut in range(0, min(4, len(b)) + 1):
            try:
                return b[: len(b) - cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
        return b.decode("utf-8", errors="replace")
