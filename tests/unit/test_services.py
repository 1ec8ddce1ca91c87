"""The services' scaffolding (trainer.services): argument checks (one line, exit 2, what was expected), the flag
table, the bearer token, the Flask app factory and the client base."""

from __future__ import annotations

import argparse
import json

import pytest

from trainer.services import cli as services
from trainer.services.app import bearer_refusal
from trainer.services.token import token_from_env


@pytest.mark.parametrize("text,message", [("0", "0 is out of range; expected a TCP port 1-65535"),
                                          ("65536", "65536 is out of range"), ("http", "'http' is not a number")])
def test_a_bad_port_says_what_a_port_is(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        services.port(text)


def test_ports_at_the_edges_pass():
    assert services.port("1") == 1 and services.port("65535") == 65535


@pytest.mark.parametrize("kind,text,message", [(int, "0", "0 must be > 0"), (int, "1.5", "'1.5' is not an int"),
                                               (float, "-1", "-1 must be > 0"), (float, "nan", "nan must be > 0"),
                                               (float, "inf", "inf must be > 0")])
def test_positive_refuses_zero_negative_nan_and_infinity(kind, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        services.positive(kind)(text)
    assert services.positive(kind)("2") == 2


def test_parser_errors_are_one_line_under_the_program_name(capsys):
    parser = services.one_line_parser("prog-x")(prog="prog-x")
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=services.one_line_parser("prog-x"))
    sub.add_parser("serve").add_argument("--port", type=services.port, required=True)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["serve", "--port", "99999"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("prog-x: error: argument --port: 99999 is out of range; expected a TCP port "
                                       "1-65535\n")


def test_a_clients_token_comes_from_the_value_then_the_file(tmp_path):
    env_file = tmp_path / "token"
    env_file.write_text("from-file\n")

    def token(env):
        return token_from_env("x", "X_TOKEN", "X_TOKEN_FILE", ValueError, env)

    assert token({"X_TOKEN": " direct ", "X_TOKEN_FILE": str(env_file)}) == "direct"
    assert token({"X_TOKEN": "  ", "X_TOKEN_FILE": str(env_file)}) == "from-file"  # a blank value is no token
    assert token({}) is None
    with pytest.raises(ValueError, match=r"cannot read the x token file \$X_TOKEN_FILE=.*missing"):
        token({"X_TOKEN_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match=r"the x token file \$X_TOKEN_FILE=.*empty is empty"):
        token({"X_TOKEN_FILE": str(tmp_path / "empty")})


def test_bearer_refusal_names_what_is_wrong():
    token = b"s3cret"
    assert bearer_refusal(None, token)[:2] == (401, "no token")
    assert bearer_refusal("Basic s3cret", token)[:2] == (401, "not a bearer token")
    assert bearer_refusal("Bearer ", token)[:2] == (401, "not a bearer token")
    assert bearer_refusal("Bearer nope", token) == (403, "wrong token", "invalid bearer token")
    assert bearer_refusal("bearer  s3cret ", token) is None


def test_a_flag_row_gives_both_spellings_its_dest_and_its_group(capsys):
    from trainer.services.cli import Flag, add_flags

    table = (Flag("max-items", "items", default=4, type=services.positive(int)),
             Flag("max-number-digits", "digits", default=7, type=int, dest="max_digits"),
             Flag("token-file", "token", exclusive="auth"), Flag("no-auth", "off", switch=True, exclusive="auth"),
             Flag("keepalive", "idle seconds", default=5.0, type=float, group="connections"))
    parser = add_flags(services.one_line_parser("prog-y")(prog="prog-y"), table)
    assert vars(parser.parse_args([])) == {"max_items": 4, "max_digits": 7, "token_file": None, "no_auth": False,
                                           "keepalive": 5.0}
    snake = parser.parse_args(["--max_items", "9", "--max_number_digits", "0", "--no_auth"])
    kebab = parser.parse_args(["--max-items", "9", "--max-number-digits", "0", "--no-auth"])
    assert snake == kebab and (kebab.max_items, kebab.max_digits, kebab.no_auth) == (9, 0, True)
    assert "connections:" in parser.format_help() and "--keepalive KEEPALIVE" in parser.format_help()
    assert [a.option_strings for a in parser._actions if a.dest == "keepalive"] == [["--keepalive"]]  # one word
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--token-file", "t", "--no-auth"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "prog-y: error: argument --no-auth/--no_auth: not allowed with argument " \
                                      "--token-file/--token_file\n"
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-items", "-1"])
    assert capsys.readouterr().err == "prog-y: error: argument --max-items/--max_items: -1 must be > 0\n"


@pytest.mark.parametrize("module", ["trainer.reward.server.__main__", "trainer.retrieval.__main__"])
def test_every_flag_of_both_services_takes_both_spellings(module):
    import importlib

    main = importlib.import_module(module)
    tables = [main.FLAGS] if hasattr(main, "FLAGS") else [main.BUILD_FLAGS, main.SERVE_FLAGS]
    for table in tables:
        names = [f.name for f in table]
        assert len(names) == len(set(names)), names
        for f in table:
            assert f.name == f.name.lower() and "_" not in f.name, f.name  # the kebab spelling is the row's name
            assert f.spellings[-1] == "--" + f.name.replace("-", "_")


def _app(token="s3cret", max_body_bytes=64):
    import logging

    from trainer.services.app import create_service_app, read_body

    app = create_service_app("test-app", token=token, realm="rlrun-test", routes="POST /work, GET /health_check",
                             max_body_bytes=max_body_bytes, log=logging.getLogger("test-app"))

    @app.get("/health_check")
    def health_check():
        return {"status": "ok"}

    @app.post("/work")
    def work():
        if json.loads(read_body(max_body_bytes) or b"{}").get("boom"):
            raise RuntimeError("secret internals")
        return {"done": True}

    return app.test_client()


def test_the_app_factory_checks_the_token_except_on_health_check(caplog):
    client = _app()
    assert client.get("/health_check").status_code == 200
    missing = client.post("/work", json={})
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == 'Bearer realm="rlrun-test"'
    assert missing.get_json() == {"error": "missing Authorization header; expected 'Authorization: Bearer <token>'"}
    with caplog.at_level("WARNING"):
        wrong = client.post("/work", json={}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403 and "WWW-Authenticate" not in wrong.headers
    assert "refused POST /work" in caplog.text and "(wrong token)" in caplog.text and "nope" not in caplog.text
    assert client.post("/work", json={}, headers={"Authorization": "Bearer s3cret"}).get_json() == {"done": True}
    assert _app(token=None).post("/work", json={}).status_code == 200  # no token: no authentication


def test_the_app_factory_answers_every_error_as_json(caplog):
    client, auth = _app(), {"Authorization": "Bearer s3cret"}
    nope = client.get("/nope", headers=auth)
    assert nope.status_code == 404
    assert nope.get_json() == {"error": "no such endpoint '/nope'; expected one of: POST /work, GET /health_check"}
    wrong_method = client.get("/work", headers=auth)
    assert wrong_method.status_code == 405 and "method GET is not allowed on '/work'" in wrong_method.get_json()["error"]
    assert "POST" in wrong_method.headers["Allow"].split(", ")
    big = client.post("/work", data=b"x" * 100, headers=auth)
    assert big.status_code == 413
    assert big.get_json() == {"error": "request body is larger than 64 bytes (--max-body-bytes)"}
    with caplog.at_level("ERROR"):
        boom = client.post("/work", json={"boom": True}, headers=auth)
    assert boom.status_code == 500 and boom.get_json() == {"error": "internal error"}
    assert "secret internals" not in boom.get_data(as_text=True) and "secret internals" in caplog.text
