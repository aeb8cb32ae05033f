"""Deployment: per-node files, Mosquitto credentials and ACLs, docker-compose, Raspberry Pi nodes."""

from .commands import commands_text
from .compose import compose_yaml, service_names
from .launcher import publish_config, run_network
from .mosquitto_auth import (
    EAVESDROPPER_USER,
    LAUNCHER_USER,
    BrokerPaths,
    TlsFiles,
    acl_text,
    hash_password,
    mosquitto_conf,
    node_user,
    password_file_text,
    security_lines,
    verify_password,
)
from .nodefile import NodeFile, ValueSource, load_node_file, node_file_argv
from .plan import (
    DeployPlan,
    LoadedPlan,
    PlanSpec,
    build_plan,
    load_plan,
    parse_corrupt,
    write_plan,
)
from .spec import plan_spec

__all__ = [
    "EAVESDROPPER_USER",
    "LAUNCHER_USER",
    "BrokerPaths",
    "DeployPlan",
    "LoadedPlan",
    "NodeFile",
    "PlanSpec",
    "TlsFiles",
    "ValueSource",
    "acl_text",
    "build_plan",
    "commands_text",
    "compose_yaml",
    "hash_password",
    "load_node_file",
    "load_plan",
    "mosquitto_conf",
    "node_file_argv",
    "node_user",
    "parse_corrupt",
    "password_file_text",
    "plan_spec",
    "publish_config",
    "run_network",
    "security_lines",
    "service_names",
    "verify_password",
    "write_plan",
]
