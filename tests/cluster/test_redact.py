"""Secrets are scrubbed from text, argument lists and documents."""

from __future__ import annotations

from cluster.redact import REDACTED, Redactor, collect_secret_values


def test_known_values_and_patterns_are_redacted() -> None:
    r = Redactor(["my-known-secret"])
    args = r.args(
        [
            "https://acct.blob.core.windows.net/c/chips.zarr?sv=2022-11-02&sig=AbC%2Bd&se=2030",
            "--storage-options",
            '{"account_name": "acct", "account_key": "k3y=="}',
            "--sas-token",
            "sv=2022&sig=xyz",
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=abc==;EndpointSuffix=x",
            "AZURE_STORAGE_CONNECTION_STRING=BlobEndpoint=https://a;SharedAccessSignature=sv=1",
            "echo my-known-secret",
            "--epochs",
            "3",
        ]
    )
    text = " ".join(args)
    for secret in (
        "AbC%2Bd",
        "k3y==",
        "xyz",
        "abc==",
        "my-known-secret",
        "SharedAccessSignature=sv",
    ):
        assert secret not in text
    assert args[0].endswith(f"sig={REDACTED}&se=2030")  # the rest of the URL stays readable
    assert '"account_name": "acct"' in args[2]
    assert args[4] == REDACTED
    assert args[-2:] == ["--epochs", "3"]


def test_documents_are_redacted_by_key_and_by_text() -> None:
    r = Redactor()
    document = {
        "credentials": {"accountKey": "abc"},
        "env": [{"name": "X", "value": "AccountKey=zzz;"}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "replicas": 2,
    }
    out = r.data(document)
    assert out["credentials"] == REDACTED
    assert out["env"][0]["value"] == f"AccountKey={REDACTED};"
    assert out["tolerations"] == document["tolerations"]  # "key" is not a secret name
    assert out["replicas"] == 2


def test_secret_values_are_collected_from_any_depth() -> None:
    found = collect_secret_values(
        {
            "properties": {
                "userAccountSettings": {"adminUserName": "me", "adminUserPassword": "pw-123"},
                "nodeSetup": {
                    "mountVolumes": {
                        "azureBlobFileSystems": [{"credentials": {"accountKey": "KEY1"}}]
                    },
                    "setupTask": {"secrets": [{"name": "TOKEN_NAME", "value": "tok-456"}]},
                },
            }
        }
    )
    assert found == {"pw-123", "KEY1", "tok-456"}
