"""Part keys: the digest of everything a staged part's bytes depend on.

A key is in the part's name (and in its record or body), so a rerun with other inputs,
options or code asks for other names and never opens a part it cannot use. Every stage makes
its keys here, from the JSON values it lists (format and version first): one digest, one
encoding, so two stages never disagree on how a key is made.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

KEY_HEX = 24  # 96 bits of the SHA-256 in names: no collision between runs


def content_key(content: Mapping[str, Any], hex_digits: int = KEY_HEX) -> str:
    """The first `hex_digits` hex digits of the SHA-256 of `content` (JSON values) written
    with sorted keys and no spaces: the same content gives the same key in every process."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:hex_digits]
