"""The processes of a job, whoever started them: what each member of a job keeps and does.

* :mod:`parallax.member.protocol`: what a member offers its role (:class:`~parallax.member.protocol.JobMember`);
* :mod:`parallax.member.rank`: a process mpirun started (its server, communicators, heartbeat, exit checks),
  with :mod:`parallax.member.bootstrap` (its place in the job, read from what the launcher gave it; the exit
  barrier over MPI);
* :mod:`parallax.member.joined`: a task a cluster manager started (``TF_CONFIG``): its server at the manager's
  address, the exit barrier on worker 0's server, with :mod:`parallax.member.peer_watch` (the watch on its peers);
* :mod:`parallax.member.servers`: a member's TensorFlow server;
* :mod:`parallax.member.roles`: the roles (all-reduce worker, PS/HYBRID worker, parameter server, one local
  worker), written once against the protocol;
* :mod:`parallax.member.startup`: the start-up tail every worker shares (rewrite, session, wrapper).

The launcher's side (the mpirun command, starting and watching the ranks) is :mod:`parallax.launch`.
"""
