"""Which environment variables override which settings of the file, and how they are merged in."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Environment variables that override one setting of the file (the file's value, or the default, otherwise).
# For the settings that differ between otherwise identical hosts or containers.
ENV_OVERRIDES: dict[str, tuple[str, str]] = {
    "GARRISON_DATABASE": ("controller", "database"),
    "GARRISON_CONTROLLER_ADDRESS": ("controller", "address"),
    "GARRISON_CONTROLLER_METRICS_ADDRESS": ("controller", "metrics_address"),
    "GARRISON_AGENT_CONTROLLER": ("agent", "controller"),
    "GARRISON_NODE_NAME": ("agent", "node_name"),
    "GARRISON_AGENT_ADDRESS": ("agent", "address"),
    "GARRISON_AGENT_METRICS_ADDRESS": ("agent", "metrics_address"),
}


def apply_env_overrides(
    data: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with the settings named by ``ENV_OVERRIDES`` replaced from ``environ`` (set and non-empty),
    and which variable set which key (``{"controller.database": "GARRISON_DATABASE"}``)."""
    merged: dict[str, Any] = dict(data)
    origins: dict[str, str] = {}
    for variable, (section, key) in ENV_OVERRIDES.items():
        value = environ.get(variable)
        if not value:
            continue
        table = merged.get(section, {})
        if not isinstance(table, dict):
            continue  # parse_config reports the malformed section itself
        merged[section] = {**table, key: value}
        origins[f"{section}.{key}"] = variable
    return merged, origins
