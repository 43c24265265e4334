"""Graph rewrite passes: pure functions ``(MetaGraphDef, Plan, TaskSpec) -> MetaGraphDef``."""
