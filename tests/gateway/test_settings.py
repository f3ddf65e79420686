"""Server settings: flags over ``ACP_*`` variables over the ``--config`` TOML file, each
value checked once by the pydantic model, refusals naming the setting and its source."""

from __future__ import annotations

import pathlib

import pytest

from cleveragents.acp.facade import auth
from cleveragents.acp.gateway.settings import (
    GatewayCommandSettings,
    ServeSettings,
    SettingsError,
    load,
)
from tests.gateway.test_serve import agents


def test_defaults_then_file_then_environment_then_flags(tmp_path: pathlib.Path) -> None:
    assert load(ServeSettings, {}, environ={}) == ServeSettings()
    config = tmp_path / "acp.toml"
    config.write_text(
        'host = "::1"\nhttp_port = 9000\ngrpc_port = 9001\ncors_origins = ["https://a.example"]\n'
        'log_level = "INFO"\n'
    )
    from_file = load(ServeSettings, {}, environ={}, config=config)
    assert (from_file.host, from_file.http_port, from_file.grpc_port) == ("::1", 9000, 9001)
    assert from_file.cors_origins == ("https://a.example",)
    assert from_file.log_level == "info"
    environ = {"ACP_CONFIG": str(config), "ACP_HTTP_PORT": "9100", "ACP_CORS_ORIGIN": "https://b, https://c"}
    from_env = load(ServeSettings, {"host": None}, environ=environ)
    assert (from_env.host, from_env.http_port) == ("::1", 9100)
    assert from_env.cors_origins == ("https://b", "https://c")
    flags = {"http_port": "0", "cors_origins": ["https://d"], "insecure": True}
    from_flags = load(ServeSettings, flags, environ=environ)
    assert (from_flags.http_port, from_flags.cors_origins, from_flags.insecure) == (0, ("https://d",), True)
    assert load(ServeSettings, {}, environ={"ACP_INSECURE": "yes", "ACP_SSE_KEEPALIVE": "0.5"}).insecure


@pytest.mark.parametrize(
    ("flags", "environ", "expected"),
    [
        (
            {"http_port": "70000"},
            {},
            "http_port: Input should be less than or equal to 65535 (got '70000' from --http-port)",
        ),
        ({}, {"ACP_HTTP_PORT": "eighty"}, "from $ACP_HTTP_PORT"),
        ({}, {"ACP_MAX_BODY_BYTES": "0"}, "max_body_bytes: Input should be greater than or equal to 1"),
        ({"sse_keepalive": "-1"}, {}, "sse_keepalive: Input should be greater than 0"),
        ({}, {"ACP_LOG_LEVEL": "loud"}, "log_level"),
        ({}, {"ACP_INSECURE": "perhaps"}, "insecure"),
        ({"host": ""}, {}, "host"),
    ],
)
def test_refusals_name_the_setting_and_its_source(
    flags: dict[str, object], environ: dict[str, str], expected: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        load(ServeSettings, flags, environ=environ)
    assert expected in str(refused.value)


def test_a_bad_config_file_is_refused(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "acp.toml"
    config.write_text("http_prot = 1\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'http_prot' \(from config file"):
        load(ServeSettings, {}, environ={}, config=config)
    config.write_text("http_port = [")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load(ServeSettings, {}, environ={}, config=config)
    with pytest.raises(SettingsError, match="cannot read the config file"):
        load(ServeSettings, {}, environ={}, config=tmp_path / "missing.toml")
    with pytest.raises(SettingsError, match=r"--upstream is required \(or \$ACP_UPSTREAM"):
        load(GatewayCommandSettings, {}, environ={})


def test_the_commands_read_their_settings_so(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "acp.toml"
    config.write_text("max_body_bytes = -5\n")
    refused = agents("serve", "--config", str(config), "--tokens", "t.toml", cwd=tmp_path)
    assert refused.returncode == 2
    assert "max_body_bytes" in refused.stderr
    assert "config file" in refused.stderr
    gateway = agents("gateway", cwd=tmp_path, env={"ACP_UPSTREAM": ""})
    assert gateway.returncode == 2
    assert "--upstream is required" in gateway.stderr


def test_model_allow_lists_from_the_file_the_environment_and_the_flags(tmp_path: pathlib.Path) -> None:
    config = tmp_path / "acp.toml"
    config.write_text('model_endpoints = ["https://api.example/v1"]\nmodel_key_envs = ["OPENAI_API_KEY"]\n')
    from_file = load(ServeSettings, {}, environ={}, config=config)
    assert from_file.model_endpoints == ("https://api.example/v1",)
    assert from_file.model_key_envs == ("OPENAI_API_KEY",)
    environ = {"ACP_MODEL_ENDPOINTS": "http://a:1/v1, http://b:2", "ACP_MODEL_KEY_ENVS": "K1,K2"}
    from_env = load(ServeSettings, {}, environ=environ, config=config)
    assert from_env.model_endpoints == ("http://a:1/v1", "http://b:2")
    assert from_env.model_key_envs == ("K1", "K2")
    flags = {"model_endpoints": ["http://c/v1"], "model_key_envs": None}
    from_flags = load(ServeSettings, flags, environ=environ)
    assert (from_flags.model_endpoints, from_flags.model_key_envs) == (("http://c/v1",), ("K1", "K2"))


def test_serve_refuses_an_unusable_model_endpoint_at_start(tmp_path: pathlib.Path) -> None:
    auth.create_token(tmp_path / "t.toml", "alice", ["default"])
    refused = agents(
        "serve", "--tokens", "t.toml", "--model-endpoint", "http://me@api.example/v1", cwd=tmp_path
    )
    assert refused.returncode == 2
    assert "--model-endpoint 'http://me@api.example/v1' must not carry user info" in refused.stderr
