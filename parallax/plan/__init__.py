"""Plans: plain data saying how every variable and replica of a job is laid out."""

from parallax.plan.model import GradientRef, Plan, TaskSpec, VariablePlacement, WorkerPlan
from parallax.plan.policies import PlanOptions, build_plan

__all__ = ["Plan", "TaskSpec", "VariablePlacement", "WorkerPlan", "GradientRef", "build_plan", "PlanOptions"]
