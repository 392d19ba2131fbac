"""Subcommands of ``python -m thinkviz``, one module each; :mod:`thinkviz.cli` imports them
(importing a module registers its subcommand) and :mod:`.common` holds what they share."""
