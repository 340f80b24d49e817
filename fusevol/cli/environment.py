"""The environment defaults: every flag of `fusevol run`, and every command's `--root`, defaults to
its variable `FUSEVOL_<FLAG>` (upper case, dashes as underscores: `--node-name` is
`FUSEVOL_NODE_NAME`), as a deployment sets it (systemd's `Environment=`, the chart's `env`).

An empty variable counts as unset. A variable is converted and checked as its flag's value would
be; one its flag would not take is bad usage of any command, named by its variable, unless the
flag itself is given (a flag on the command line wins): `env_option` notes it while the parser is
built (fusevol.cli.parser), and `Parser` refuses it before anything is parsed, `--version` and
`--help` too. Excludes: the flags themselves (fusevol.cli.parser, fusevol.cli.run_parser), and
their defaults when no variable is set (`fusevol.base.settings`).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusevol.base.settings import DEFAULT_ROOT

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

ROOT_HELP = "the agent's root: pod volumes under DIR/pods/ (default: %(default)s)"


@dataclass(frozen=True)
class _BadVariable:
    """A `FUSEVOL_*` variable whose value its flag would not take: bad usage of any command
    (`--version` and `--help` included) unless the flag itself is given, which wins."""

    flag: str
    variable: str
    value: str
    reason: str

    def given_in(self, argv: Sequence[str]) -> bool:
        return any(arg == self.flag or arg.startswith(f"{self.flag}=") for arg in argv)

    def usage_error(self) -> str:
        return f"fusevol: error: {self.variable}={self.value!r}: {self.reason}\n"


class Parser(argparse.ArgumentParser):
    """Refuses a bad `FUSEVOL_*` variable before anything is parsed (`_BadVariable`)."""

    bad_variables: list[_BadVariable]

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = sys.argv[1:] if args is None else list(args)
        for bad in getattr(self, "bad_variables", ()):
            if not bad.given_in(argv):
                self.exit(2, bad.usage_error())
        return super().parse_known_args(argv, namespace)


BAD_VARIABLES: list[_BadVariable] = []
"""Filled while `fusevol.cli.parser.build_parser()` builds the parser; the top-level parser
checks them."""


def env_option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    default: object = None,
    type: Callable[[str], object] = str,
    choices: Sequence[object] | None = None,
    **kwargs: Any,
) -> None:
    """`parser.add_argument(flag, ...)` whose default is `FUSEVOL_<FLAG>` when that is set and
    not empty, converted and checked as the flag's value would be."""
    variable = "FUSEVOL_" + flag.removeprefix("--").upper().replace("-", "_")
    if value := os.environ.get(variable):
        reason = ""
        try:
            converted = type(value)
        except (TypeError, ValueError):  # what argparse catches from a type
            reason = f"invalid {getattr(type, '__name__', repr(type))} value"
        else:
            if choices is not None and converted not in choices:
                reason = f"invalid choice (choose from {', '.join(map(repr, choices))})"
        if reason:
            BAD_VARIABLES.append(_BadVariable(flag, variable, value, reason))
        else:
            default = converted
    if kwargs.get("action") == "store_true":  # a flag: the variable says whether it is given
        parser.add_argument(flag, default=default, **kwargs)
    else:
        parser.add_argument(flag, type=type, choices=choices, default=default, **kwargs)


def boolean(text: str) -> bool:
    """A flag's variable: true, yes or 1; false, no or 0 (any case); anything else is bad."""
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    try:
        return words[text.lower()]
    except KeyError:
        raise ValueError(text) from None


def root_option(parser: argparse.ArgumentParser) -> None:
    """Every command's `--root DIR`, `FUSEVOL_ROOT` too."""
    env_option(parser, "--root", type=Path, metavar="DIR", default=DEFAULT_ROOT, help=ROOT_HELP)
