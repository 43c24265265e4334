"""Starting the job: the mpirun command line (pure), the runner that watches it,
and the bootstrap each launched process runs."""
