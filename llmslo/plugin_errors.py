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
