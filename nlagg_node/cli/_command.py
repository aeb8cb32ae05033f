"""Typer commands generated from an option class of :mod:`nlagg_node.options`.

``@options_command(app, SimOptions)`` on ``def sim(opts: SimOptions) -> None`` gives the command one
``typer.Option`` per field (help text, help panel, flags, default from the declaration) and calls the
function with the options object built from them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, cast

import typer
from typer.core import TyperCommand

from ..options import PANELS, Opt, option_fields
from ..options.opt import refuse_conflicts

__all__ = ["NlaggCommand", "completer", "options_command", "parse_command"]

T = TypeVar("T")


class NlaggCommand(TyperCommand):
    """Every nlagg command: rich help in the panels its options name, help texts printed as written
    (``[run]`` is text, not markup), a switch shown without a value, and a switch given both ways refused
    (``--in-process --processes``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["rich_markup_mode"] = "rich"
        if kwargs.get("help"):
            kwargs["help"] = _escape(_reflow(kwargs["help"]))
        super().__init__(*args, **kwargs)
        for param in self.params:
            text = getattr(param, "help", None)
            if text:
                param.help = _escape(text)  # type: ignore[attr-defined]
            if getattr(param, "is_flag", False):  # a switch takes no value: no "<bool>" beside it
                param.metavar = ""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # --help is a switch too
        return option

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from typer import rich_utils

        # A width given to the context (a test's terminal_width) holds for the rich help too.
        saved = rich_utils.MAX_WIDTH
        if ctx.terminal_width is not None:
            rich_utils.MAX_WIDTH = ctx.terminal_width
        try:
            super().format_help(ctx, formatter)
        finally:
            rich_utils.MAX_WIDTH = saved

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        words = args[: args.index("--")] if "--" in args else args
        given = {w.split("=", 1)[0] for w in words if w.startswith("--")}
        for param in self.params:
            both = [flag for flag in (*param.opts, *param.secondary_opts) if flag in given]
            if param.secondary_opts and len(both) > 1:  # an on/off switch given both ways
                why = f"{both[0]} and {both[1]} contradict each other: give one"
                raise typer.BadParameter(why, ctx, cast(Any, param))
            _refuse_repeated(ctx, param, words)
        from typer._click.exceptions import UsageError  # typer 0.29 vendors click: no public name

        try:
            return super().parse_args(ctx, args)
        except UsageError as exc:  # the parser's own (``--op`` without a value) know no command: this one
            exc.ctx = exc.ctx or ctx
            raise


def _refuse_repeated(ctx: Any, param: Any, words: list[str]) -> None:
    """An option of one value given twice (``--op max --op min``): click keeps the last silently."""
    if param.param_type_name != "option" or param.is_flag or param.multiple:
        return
    uses = [
        word if "=" in word else " ".join(words[k : k + 1 + param.nargs])
        for k, word in enumerate(words)
        if word.split("=", 1)[0] in param.opts
    ]
    if len(uses) > 1:
        raise typer.BadParameter(f"given {len(uses)} times ({', '.join(uses)}): give it once", ctx, param)


def _reflow(doc: str) -> str:
    # A docstring's paragraphs, each on one line: rich keeps a single newline, so it would show the
    # source's line breaks.
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _escape(text: str) -> str:
    # Rich markup would read "[run]" or "[default: 15]" as a style tag; a docstring's ``x`` reads `x`.
    return text.replace("[", "\\[").replace("``", "`")


def _parameter(name: str, base: Any, opt: Opt, default: Any) -> inspect.Parameter:
    info = typer.Option(
        *opt.flags,
        help=opt.help,
        rich_help_panel=opt.panel,
        min=opt.min,
        metavar=opt.metavar,
        autocompletion=completer(opt.choices) if opt.choices else None,
    )
    empty = default is dataclasses.MISSING
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[base, info],
        default=inspect.Parameter.empty if empty else default,
    )


def completer(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    """Shell completion of an option's value: the choices that start with what is typed."""

    def complete(incomplete: str) -> list[str]:
        return [c for c in choices if c.startswith(incomplete)]

    return complete


def _panel_rank(opt: Opt) -> int:
    return 0 if opt.panel is None else 1 + PANELS.index(opt.panel)


def options_command(
    app: typer.Typer, cls: type[T], name: str | None = None
) -> Callable[[Callable[[T], None]], Callable[..., None]]:
    """Register ``fn(opts: cls)`` as a command of ``app`` whose options are ``cls``'s fields, grouped
    in the help by their panel; an option with ``choices`` completes them in the shell."""

    def register(fn: Callable[[T], None]) -> Callable[..., None]:
        fields = option_fields(cls)
        params = [_parameter(nm, *spec) for nm, spec in fields.items()]
        params.sort(key=lambda p: _panel_rank(fields[p.name][1]))  # keyword-only: any order is valid

        @functools.wraps(fn)
        def command(**kwargs: Any) -> None:
            opts = cls(**kwargs)
            refuse_conflicts(opts)
            fn(opts)

        del command.__wrapped__  # typer reads the signature below, not fn's
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        app.command(name, cls=NlaggCommand)(command)
        return command

    return register


def parse_command(app: typer.Typer, path: list[str], cls: type[T], args: list[str]) -> T:
    """The options object a command line builds (what the command would be called with), for tests
    and for checking a generated argument vector."""
    group: Any = typer.main.get_command(app)
    cmd = group
    for word in path:
        cmd = cmd.get_command(typer.Context(cmd), word)
    ctx = cmd.make_context(path[-1], list(args))
    return cls(**ctx.params)
