"""Text in, segments out: chat prompts (:mod:`.chat`), traces and agent transcripts
(:mod:`.transcript`) and the segmenter (:mod:`.segments`).  Nothing here imports the rest of ThinkViz;
``inspect``'s report, which tokenizes as a replay does, is :mod:`thinkviz.measure.inspection`."""
