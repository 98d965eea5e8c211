"""The redaction function on the shapes secrets take in messages (the real paths are in test_no_leaks)."""

from __future__ import annotations

import logging

import pytest

from snapshot_assets.redaction import (
    REDACTED,
    dsn_problem,
    install_log_redaction,
    redact,
    register_dsn,
    register_secret,
)

SECRET = "Pw-7f3a9c1e"


@pytest.mark.parametrize("text", [
    f"postgresql://app:{SECRET}@db.internal:5432/prod",
    f"host=db user=app password={SECRET} dbname=prod",
    f"host=db password='{SECRET} with spaces' dbname=prod",
    f'{{"SecretAccessKey": "{SECRET}", "AccessKeyId": "AKIA"}}',
    f"aws_session_token = {SECRET}",
    f"AWS_SECRET_ACCESS_KEY={SECRET}",
    f"sc://localhost:15002/;token={SECRET}",
    f"key: -----BEGIN RSA PRIVATE KEY-----\nMII{SECRET}\n-----END RSA PRIVATE KEY-----",
    f"cut off: -----BEGIN PRIVATE KEY-----\nMII{SECRET}",
])
def test_secrets_are_recognised_by_their_context(text: str) -> None:
    clean = redact(text)
    assert SECRET not in clean and REDACTED in clean, clean


def test_registered_values_are_removed_anywhere_in_any_spelling() -> None:
    value = "Reg/istered+Value 9"
    register_secret(value)
    for spelling in (value, "Reg%2Fistered%2BValue%209", '"Reg/istered+Value 9"'):
        assert "istered" not in redact(f"the server said: {spelling}!")


def test_short_values_are_left_to_the_context_rules() -> None:
    register_secret("ab")
    assert redact("tab stab") == "tab stab"


def test_a_dsn_password_is_registered_even_when_libpq_cannot_parse_the_dsn() -> None:
    register_dsn("host=db password='Unterminated-9z1")
    assert "Unterminated-9z1" not in redact("somewhere: Unterminated-9z1")


def test_dsn_problems_quote_no_piece_of_the_dsn() -> None:
    problem = dsn_problem(f"host=db password=Secret {SECRET} dbname=x")
    assert problem is not None and SECRET not in problem and "missing \"=\"" in problem, problem
    assert dsn_problem("host=db port=5 dbname=x") is None


def test_log_records_are_redacted_when_made(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction()
    log = logging.getLogger("tests.secrets")
    try:
        raise ValueError(f"connect to postgresql://u:{SECRET}@h failed")
    except ValueError:
        log.exception("dsn %s failed", f"host=h password={SECRET}")
    assert caplog.records and SECRET not in caplog.text, caplog.text


def test_a_slot_keeps_only_its_latest_value() -> None:
    register_secret("FirstToken-1111", slot="assumed test SessionToken")
    register_secret("SecondToken-2222", slot="assumed test SessionToken")
    assert redact("FirstToken-1111 SecondToken-2222") == f"FirstToken-1111 {REDACTED}"
