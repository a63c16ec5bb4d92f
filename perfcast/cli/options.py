"""Options given once: what every perfcast argument parser shares (the commands' and
`perfcast profile`'s, which parses its own arguments before the script's)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

# Where StoreOnce records the options given so far (OnceParser removes it after parsing).
_GIVEN = "_perfcast_given"


class StoreOnce(argparse._StoreAction):
    """An option's value, refused when the option comes again with another one: argparse
    kept the last silently (`--top 3 ... --top 5` listed 5), and the user who wrote both
    meant one of them. The same value twice is harmless and accepted."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given: dict[str, Any] = namespace.__dict__.setdefault(_GIVEN, {})
        if self.dest in given and given[self.dest] != values:
            raise argparse.ArgumentError(
                self, f"given twice ({given[self.dest]!r}, then {values!r}): give it once"
            )
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class OnceParser(argparse.ArgumentParser):
    """An ArgumentParser whose value options (and its subparsers') take one value each."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreOnce)
        self.register("action", "store", StoreOnce)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        vars(parsed).pop(_GIVEN, None)  # StoreOnce's record, not an argument
        return parsed, rest
