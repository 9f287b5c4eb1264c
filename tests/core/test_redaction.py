"""raybench/core/redaction.py: URIs keep where they point and lose what logs in (userinfo, query, fragment)."""

from __future__ import annotations

import pytest

from raybench.core.redaction import redact_config, redact_text, redact_uri, uri_secrets


@pytest.mark.parametrize(("uri", "expect"), [
    ("https://user:pass@mlflow.example.org:5000/api?token=t#f", "https://mlflow.example.org:5000/api"),
    ("s3://bucket/run?access_key=A&secret_key=B", "s3://bucket/run"),
    ("postgresql://u:p@db:5432/mlflow", "postgresql://db:5432/mlflow"),
    ("https://u:p#w@host/x", "https://host/x"),  # unencoded # and @ in a password
    ("https://u:p@ss@host", "https://host"),
    ("https://host/path?email=a@b", "https://host/path"),
    ("file:///tmp/mlruns", "file:///tmp/mlruns"),
    ("s3://bucket/runs/demo", "s3://bucket/runs/demo"),
    ("/local/path?not-a-uri", "/local/path?not-a-uri"),
])
def test_redact_uri(uri, expect):
    assert redact_uri(uri) == expect
    assert redact_text(f"uri: {uri}\n") == f"uri: {expect}\n"


def test_redact_text_keeps_everything_but_the_credentials():
    text = "# at https://bob:pw@h/x\nrun_dir: 's3://b/r?sig=1'\nname: demo\nlist: [http://u@a/b, c]\n"
    assert redact_text(text) == "# at https://h/x\nrun_dir: 's3://b/r'\nname: demo\nlist: [http://a/b, c]\n"


def test_redact_config_walks_every_string():
    cfg = {"run_dir": "s3://b/r?sig=1", "n": 3, "flag": None,
           "tracking": {"mlflow": {"uri": "https://u:p@h/api"}}, "hosts": ["http://a:b@c", ("gs://x?y",)]}
    out = redact_config(cfg)
    assert out == {"run_dir": "s3://b/r", "n": 3, "flag": None, "tracking": {"mlflow": {"uri": "https://h/api"}},
                   "hosts": ["http://c", ("gs://x",)]}
    assert cfg["run_dir"] == "s3://b/r?sig=1"  # a copy: the caller's config is unchanged


def test_uri_secrets_are_exactly_what_redaction_cuts():
    secrets = uri_secrets("a: https://u:p&q@h/x?t=1&s=2#f\nb: s3://bucket/run\n")
    assert secrets == {b"u:p&q@", b"u:p&amp;q@", b"?t=1&s=2#f", b"?t=1&amp;s=2#f"}
    assert uri_secrets("s3://bucket/run file:///x") == set()


RFC3986_USERINFO = "AZaz09-._~%41!$&'()*+,;=:"  # unreserved, pct-encoded, sub-delims and ":" (RFC 3986 §3.2.1)


@pytest.mark.parametrize("password", ["pa'ss", "it's", RFC3986_USERINFO, "'", "p'@x"])
def test_every_character_rfc_3986_allows_in_userinfo_is_cut_with_it(password):
    uri = f"https://alice:{password}@mlflow.example.org/api"
    assert redact_uri(uri) == "https://mlflow.example.org/api"
    for text in (f"uri: {uri}\n", f"# logged to {uri} today\n", f'{{"uri": "{uri}"}}', f"<a href={uri}>x</a>"):
        out = redact_text(text)
        assert "alice" not in out and password not in out.replace("mlflow.example.org/api", ""), out
        assert "https://mlflow.example.org/api" in out
    assert f"alice:{password}@".encode() in uri_secrets(f"uri: {uri}\n")


def test_a_single_quote_closing_a_quoted_string_is_not_part_of_the_uri():
    text = "a: 's3://b/r?sig=1'\nb: ['http://u@h/x', 'y']\nc: {'k': 'https://h/p'}\n"
    assert redact_text(text) == "a: 's3://b/r'\nb: ['http://h/x', 'y']\nc: {'k': 'https://h/p'}\n"
    assert redact_text("q: s3://b/r?sig=ab'cd\n") == "q: s3://b/r\n"  # a quote inside the query is cut with it
