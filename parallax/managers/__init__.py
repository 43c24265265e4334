"""Jobs whose processes a cluster manager starts (Kubernetes, Polyaxon, SageMaker, Vertex, MPIJob).

* :mod:`parallax.managers.tf_config`: ``TF_CONFIG`` read into the job's
  cluster and this process's task (pure);
* :mod:`parallax.member.joined`: what a process a manager started keeps for
  its life: its server at the address the manager gave, the exit barrier, and
  the watch on its peers (a dead task ends the others, naming it).
"""
