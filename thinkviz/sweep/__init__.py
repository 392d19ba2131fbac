"""Budget × policy × KV-format sweeps: the grid and one group's work (:mod:`.grid`), resumable result
stores (:mod:`.store`), the work a worker loads (:mod:`.work`), running groups here or on Ray
(:mod:`.runner`, :mod:`.ray_pool`)."""
