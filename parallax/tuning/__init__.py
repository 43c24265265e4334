"""``parallax tune``: the layouts to try (:mod:`.candidates`), the trials and report (:mod:`.tuner`), and the
stored result the next ``parallel_run`` applies (:mod:`.cache`)."""
