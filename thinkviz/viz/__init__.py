"""Pure renderers: token HTML (:mod:`.tokens`), plotly figures (:mod:`.figures`) and tables
(:mod:`.tables`).  Functions of plain data and :class:`~thinkviz.core.events.RunRecord`; no Gradio here."""
