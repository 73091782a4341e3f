"""The progress callback every long-running function takes.

A function that works for a while accepts ``progress(done, total, stage)`` and calls it as it
goes: ``done`` out of ``total`` steps of the stage named ``stage`` (a short phrase such as
``"predict"``). The command line draws it as a bar; another front end shows it its own way.
``None`` means nobody is listening.
"""

from __future__ import annotations

from typing import Callable, Optional

__all__ = ["ProgressFn"]

#: ``progress(done, total, stage)``, or None.
ProgressFn = Optional[Callable[[int, int, str], None]]
