"""Replay and fidelity: teacher-forced replay in lockstep with the full cache (:mod:`.replay`),
side-by-side columns (:mod:`.comparison`), ΔNLL / KL / top-1 (:mod:`.metrics`), the attention an
answer pays (:mod:`.answer_attention`), the price of a run (:mod:`.estimate`),
what a run is asked to do (:mod:`.requests`) and ``inspect``'s report on a trace (:mod:`.inspection`)."""
