"""The one TOML configuration file shared by the controller, the agents and the CLI.

Every key is validated on load; an error names the file and the key (``ConfigError``). Unknown keys are
errors too, because a misspelt setting that is silently ignored is worse than a refusal to start.

This package answers its questions one module each; import from here, not from the modules:

| module           | question                                                                 |
|------------------|--------------------------------------------------------------------------|
| ``schema``       | which settings exist, of what type, with what defaults                   |
| ``errors``       | what a configuration error looks like                                    |
| ``reader``       | how one TOML table is read into typed values (and durations parsed)      |
| ``sections``     | how [controller] and [agent] become their configuration objects          |
| ``checks``       | which checks span several keys of a section                              |
| ``environment``  | which environment variables override which settings                      |
| ``loading``      | where the file is, and how it is read, merged and validated              |
"""

from __future__ import annotations

from garrison.config.environment import ENV_OVERRIDES, apply_env_overrides
from garrison.config.errors import ConfigError
from garrison.config.loading import (
    config_path_from_env,
    controller_address_from_env,
    load_config,
    parse_config,
)
from garrison.config.reader import parse_duration
from garrison.config.schema import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_QOS,
    PRESET_TIME_LIMIT_LONG_S,
    PRESET_TIME_LIMIT_SHORT_S,
    AccountConfig,
    AgentConfig,
    ControllerConfig,
    GarrisonConfig,
    PartitionConfig,
    QosConfig,
    QuotaConfig,
    SchedulerSettings,
    SwitchConfig,
    UserConfig,
)

# The public names of the single module this package replaced, so no importer had to change.
__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_QOS",
    "ENV_OVERRIDES",
    "PRESET_TIME_LIMIT_LONG_S",
    "PRESET_TIME_LIMIT_SHORT_S",
    "AccountConfig",
    "AgentConfig",
    "ConfigError",
    "ControllerConfig",
    "GarrisonConfig",
    "PartitionConfig",
    "QosConfig",
    "QuotaConfig",
    "SchedulerSettings",
    "SwitchConfig",
    "UserConfig",
    "apply_env_overrides",
    "config_path_from_env",
    "controller_address_from_env",
    "load_config",
    "parse_config",
    "parse_duration",
]
