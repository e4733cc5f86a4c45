"""Keep secrets out of plans, written files and logs.

Two nets, both applied to everything we show or write:
- the literal values of secrets we know (account keys, passwords and setup-task secrets read
  from cluster.json) are replaced wherever they appear, even in a worker's output;
- patterns catch the secrets we were never told about: `AccountKey=` and
  `SharedAccessSignature=` in connection strings, `sig=` in SAS URLs, and the values of keys
  such as `account_key`, `sas_token`, `connection_string`, `client_secret`, `password` in JSON
  (`--storage-options '{"account_key": "..."}'`) or `KEY=value` text.

What is executed keeps the real values; only what is displayed or written is redacted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REDACTED = "<redacted>"

# Key names whose values are secrets (compared after dropping `_`, `-` and case).
_SECRET_KEYS = frozenset(
    {
        "accountkey",
        "sastoken",
        "sas",
        "token",  # s3fs, gcsfs
        "sessiontoken",
        "privatekey",
        "credential",
        "credentials",
        "connectionstring",
        "clientsecret",
        "password",
        "adminuserpassword",
        "secret",
        "secrets",
        "apikey",
        "accesskey",
        "azurestoragekey",
        "azurestorageaccountkey",
        "azurestoragesastoken",
        "azurestorageconnectionstring",
        "azureclientsecret",
    }
)

# Secret-valued key names as they appear in text (JSON, KEY=value, --flag value).
_KEY_WORDS = (
    r"account[_-]?key|sas[_-]?token|connection[_-]?string|client[_-]?secret|password|"
    r"azure_storage_key|azure_storage_account_key|azure_storage_sas_token|"
    r"azure_storage_connection_string|azure_client_secret|credential"
)
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # connection strings: AccountKey=...; SharedAccessSignature=...;
    (re.compile(r"(?i)\b(AccountKey|SharedAccessSignature)=[^;\s\"']+"), rf"\1={REDACTED}"),
    # SAS query parameters: the signature is the secret part
    (re.compile(r"(?i)([?&]sig=)[^&\s\"']+"), rf"\g<1>{REDACTED}"),
    # "account_key": "value", account_key=value, ACCOUNT_KEY: value
    (
        re.compile(rf"(?i)([\"']?\b(?:{_KEY_WORDS})\b[\"']?\s*[:=]\s*[\"']?)([^\"'\s,;}}&]+)"),
        rf"\g<1>{REDACTED}",
    ),
)
# `--account-key VALUE` as two command-line tokens
_SECRET_FLAG = re.compile(rf"(?i)^--?(?:{_KEY_WORDS})$")


def _normalised_key(key: str) -> str:
    return key.replace("_", "").replace("-", "").lower()


def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a secret (`accountKey`, `sas_token`, `password`, ...)."""
    return _normalised_key(key) in _SECRET_KEYS


def collect_secret_values(obj: Any) -> frozenset[str]:
    """Every string value under a secret-named key, at any depth (cluster.json's account keys,
    admin passwords, setup-task secrets), so they can be scrubbed from any text later."""
    found: set[str] = set()

    def walk(node: Any, secret: bool) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if secret and key == "name":  # setupTask secrets are [{name, value}]
                    continue
                walk(value, secret or (isinstance(key, str) and is_secret_key(key)))
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item, secret)
        elif isinstance(node, str) and secret and node:
            found.add(node)

    walk(obj, False)
    return frozenset(found)


class Redactor:
    """Replaces known secret values and secret-looking patterns by `<redacted>`."""

    __slots__ = ("_values",)

    def __init__(self, secret_values: Iterable[str] = ()) -> None:
        # longest first, so a secret that contains another is replaced whole
        self._values = tuple(sorted({v for v in secret_values if len(v) >= 4}, key=len)[::-1])

    def text(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, REDACTED)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text

    def args(self, args: Sequence[str]) -> list[str]:
        out: list[str] = []
        hide_next = False
        for arg in args:
            if hide_next:
                out.append(REDACTED)
                hide_next = False
                continue
            if _SECRET_FLAG.match(arg):
                hide_next = True
            out.append(self.text(arg))
        return out

    def data(self, obj: Any) -> Any:
        """A copy of a JSON-like structure with secret-named keys and secret text redacted."""
        if isinstance(obj, Mapping):
            return {
                k: (REDACTED if isinstance(k, str) and is_secret_key(k) else self.data(v))
                for k, v in obj.items()
            }
        if isinstance(obj, list | tuple):
            return [self.data(v) for v in obj]
        if isinstance(obj, str):
            return self.text(obj)
        return obj
