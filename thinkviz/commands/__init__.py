"""Subcommands of ``python -m thinkviz``, one module each; :mod:`thinkviz.cli` imports them
(importing a module registers its subcommand) and :mod:`.common` holds what they share.
:mod:`.predictor_training` is no subcommand: it is the library ``train-predictor`` drives."""
