"""Text cleaning and the per-document facts preparation needs (pure functions).

Cleaning is deliberately conservative: Unicode NFC normalisation, Windows/Mac line
endings to `\\n`, control characters other than tab and newline removed, surrounding
whitespace stripped. Anything shorter than `min_doc_chars` afterwards is dropped and
counted as "empty"; exact duplicates (same cleaned text) are dropped and counted.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

# C0 controls except \t and \n, DEL, and the C1 block. \r is handled before this.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def clean_text(text: str) -> str:
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    return text.strip()


def document_hash(text: str) -> bytes:
    """Content hash of a cleaned document: de-duplication key and held-out split key."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def is_held_out(digest: bytes, eval_fraction: float) -> bool:
    """Deterministic split: the document's hash, read as a number in [0, 1), below the fraction."""
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


def non_ascii_count(text: str) -> int:
    return 0 if text.isascii() else len(_NON_ASCII.findall(text))
