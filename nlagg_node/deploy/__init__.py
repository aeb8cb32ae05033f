"""Deployment: per-node files, Mosquitto credentials and ACLs, docker-compose, Raspberry Pi nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .commands import commands_text as commands_text
    from .compose import compose_yaml as compose_yaml
    from .compose import service_names as service_names
    from .launcher import publish_config as publish_config
    from .launcher import run_network as run_network
    from .mosquitto_auth import EAVESDROPPER_USER as EAVESDROPPER_USER
    from .mosquitto_auth import LAUNCHER_USER as LAUNCHER_USER
    from .mosquitto_auth import BrokerPaths as BrokerPaths
    from .mosquitto_auth import TlsFiles as TlsFiles
    from .mosquitto_auth import acl_text as acl_text
    from .mosquitto_auth import hash_password as hash_password
    from .mosquitto_auth import mosquitto_conf as mosquitto_conf
    from .mosquitto_auth import node_user as node_user
    from .mosquitto_auth import password_file_text as password_file_text
    from .mosquitto_auth import security_lines as security_lines
    from .mosquitto_auth import verify_password as verify_password
    from .nodefile import NodeFile as NodeFile
    from .nodefile import ValueSource as ValueSource
    from .nodefile import load_node_file as load_node_file
    from .nodefile import node_file_argv as node_file_argv
    from .plan import DeployPlan as DeployPlan
    from .plan import LoadedPlan as LoadedPlan
    from .plan import PlanSpec as PlanSpec
    from .plan import build_plan as build_plan
    from .plan import load_plan as load_plan
    from .plan import parse_corrupt as parse_corrupt
    from .plan import write_plan as write_plan
    from .spec import plan_spec as plan_spec

__all__, __getattr__ = lazy_exports(__name__, __file__)
