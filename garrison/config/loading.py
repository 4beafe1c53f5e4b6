"""Where the configuration file is, and how it is read: TOML parsed, environment overrides merged, every
section validated, and any error prefixed with the file (and the variable, when the environment set it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from garrison.config.environment import apply_env_overrides
from garrison.config.errors import ConfigError
from garrison.config.schema import DEFAULT_CONFIG_PATH, GarrisonConfig
from garrison.config.sections import read_agent, read_controller


def parse_config(data: Mapping[str, Any], path: str) -> GarrisonConfig:
    unknown = sorted(set(data) - {"controller", "agent"})
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown section")
    try:
        controller = read_controller(data.get("controller", {}), "controller")
        agent = read_agent(data.get("agent", {}), "agent")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return GarrisonConfig(path=path, controller=controller, agent=agent)


def load_config(path: str | Path, environ: Mapping[str, str] = os.environ) -> GarrisonConfig:
    import tomllib  # here, not at the top: the CLI usually finds the controller without reading a file

    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    data, origins = apply_env_overrides(data, environ)
    try:
        return parse_config(data, str(path))
    except ConfigError as exc:
        # A bad value that came from the environment: say so, or the admin searches the file in vain.
        for key, variable in origins.items():
            if f": {key}:" in str(exc):
                raise ConfigError(f"{exc} (set by the environment variable {variable})") from None
        raise


def config_path_from_env(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get("GARRISON_CONFIG") or DEFAULT_CONFIG_PATH)


def controller_address_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """Where the CLI finds the controller: GARRISON_CONTROLLER, else the config file's address."""
    address = environ.get("GARRISON_CONTROLLER")
    if address:
        return address
    return load_config(config_path_from_env(environ)).controller.address
