"""Presets and their recordings: presets (:mod:`.presets`), recording a preset's runs
(:mod:`.record`), reading recordings (:mod:`.recordings`) and playing them with no model
(:mod:`.playback`)."""
