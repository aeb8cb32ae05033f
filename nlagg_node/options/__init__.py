"""Every command-line option of nlagg's run commands, declared once.

Each option is a field of a frozen dataclass: its type, its default, and in :class:`Opt` its help
text, its help panel and its flag. The Typer commands (:func:`nlagg_node.cli._command.options_command`),
the ``nlagg node`` / ``nlagg eavesdrop`` argument vectors (:func:`to_argv`), the node files
(:func:`nlagg_node.deploy.nodefile.node_file_options`) and the plan spec
(:func:`nlagg_node.deploy.spec.plan_spec`) are all built from these classes, so a flag is written in one
place. Values are validated where they are used: run parameters by :class:`nlagg_node.config.RunConfig`
(:meth:`ModelOptions.run_config`), the rest by the command (errors name the field). Plain Python on
purpose: ``nlagg --help`` loads no pydantic.

Modules: :mod:`.opt` (how an option is declared and read back), :mod:`.run` (``sim``, ``testbed`` and
the run parameters), :mod:`.deploy` (``deploy plan``/``compose``), :mod:`.clients` (``node``,
``eavesdrop``), :mod:`.tune` (``tune``).
"""

from .clients import EavesdropOptions, NodeOptions
from .deploy import ComposeOptions, PlanOptions, PlanRunOptions
from .epochs import DeploymentEpochOptions, EpochOptions, ResultsOptions
from .opt import (
    ADVERSARY,
    EPOCHS,
    FORCE_HELP,
    GRAPH,
    NETWORK,
    OUTPUT,
    PANELS,
    PROTOCOL,
    QUIET_HELP,
    RUN,
    STOPPING,
    VALUES,
    VERBOSE_HELP,
    Opt,
    flag_of,
    option_fields,
    to_argv,
)
from .run import CorruptOptions, ModelOptions, RunOptions, SimOptions, TestbedOptions, ValueSourceOptions
from .tune import TuneOptions

__all__ = [
    "ADVERSARY",
    "EPOCHS",
    "FORCE_HELP",
    "GRAPH",
    "NETWORK",
    "OUTPUT",
    "PANELS",
    "PROTOCOL",
    "QUIET_HELP",
    "RUN",
    "STOPPING",
    "VALUES",
    "VERBOSE_HELP",
    "ComposeOptions",
    "CorruptOptions",
    "DeploymentEpochOptions",
    "EavesdropOptions",
    "EpochOptions",
    "ModelOptions",
    "NodeOptions",
    "Opt",
    "PlanOptions",
    "PlanRunOptions",
    "ResultsOptions",
    "RunOptions",
    "SimOptions",
    "TestbedOptions",
    "TuneOptions",
    "ValueSourceOptions",
    "flag_of",
    "option_fields",
    "to_argv",
]
