"""The one error the `llmslo/*` SLI-plugin option reader raises (its own module so every part of the reader
can raise it without importing the others)."""

from __future__ import annotations


class PluginOptionError(ValueError):
    """A plugin option a spec got wrong. `option` names it ("" for the options as a whole), `fix` says what to
    write instead; the caller (slogen's loader, the tap's) adds the file, line and SLO."""

    def __init__(self, message: str, option: str = "", fix: str = ""):
        super().__init__(message)
        self.option = option
        self.fix = fix


class PluginOptionErrors(PluginOptionError):
    """Several options wrong at once, each a PluginOptionError in `errors`, so a spec is fixed in one pass. Read as
    one PluginOptionError it is the first of them, for a caller that reports one."""

    def __init__(self, errors: list[PluginOptionError]):
        first = errors[0]
        super().__init__(str(first), first.option, first.fix)
        self.errors = list(errors)
