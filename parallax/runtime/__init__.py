"""What runs in each rank around the rewritten graph.

The session ``parallel_run`` returns (:mod:`.session`), the program's hooks and
savers on it (:mod:`.hooks`, :mod:`.saver_calls`), the translation of its fetches
and feeds (:mod:`.translate`), checkpoints under the single-device names
(:mod:`.checkpoint`, :mod:`.zero_checkpoint`), profiling (:mod:`.profiling`) and
the program's graph as ``parallel_run`` receives it (:mod:`.graph_input`).
"""
