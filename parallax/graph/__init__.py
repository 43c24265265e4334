"""The graph vocabulary every layer uses: reading and rewiring TensorFlow graph defs (:mod:`.graph_ops`) and the
names of the ops Parallax makes (:mod:`.names`)."""
